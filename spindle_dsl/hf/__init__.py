"""Hugging Face models in and out: ``hf("DIR")`` as a kind, weights from HF folders, and
``spindle export --format hf``.

- ``config``: a folder's config.json -> a kind and its arguments (``resolve``), by
  ``model_type``; the families it knows are in ``llama`` (llama, mistral, qwen2) and
  ``towers`` (vit, clip and its towers, siglip's vision tower, whisper's encoder).
- ``mapping``: the two tables each family is written as (config fields <-> arguments, HF
  tensors <-> ours), read both ways so that import and export cannot disagree.
- ``load``: a part's tensors from a folder's safetensors (single or sharded), each rank
  reading only what it holds; ``export``: a module as a folder transformers loads.
"""
