"""Which files of a Hugging Face folder hold its weights (no torch, no tensors read).

A folder holds ``model.safetensors``, or shards listed by ``model.safetensors.index.json``
(``weight_map``: tensor name -> shard file). PyTorch pickles (``pytorch_model.bin``) are not
read: they run code when loaded; ``transformers`` converts them (``save_pretrained`` with
``safe_serialization``).
"""

from __future__ import annotations

import json
import os

from spindle_dsl.hf.mapping import HfError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def has_weights(folder: str) -> bool:
    """Whether ``folder`` holds safetensors weights."""
    return any(os.path.isfile(os.path.join(folder, n)) for n in (SINGLE, INDEX))


def pickled_only(folder: str) -> bool:
    """Whether ``folder`` holds weights only as PyTorch pickles."""
    return not has_weights(folder) and any(os.path.isfile(os.path.join(folder, n)) for n in PICKLES)


def weight_map(folder: str) -> dict[str, str]:
    """Tensor name -> the safetensors file (a full path) holding it."""
    index = os.path.join(folder, INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as fh:
                mapping = json.load(fh)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HfError(f"{index} is not a safetensors index: {exc}") from None
        return {k: os.path.join(folder, v) for k, v in mapping.items()}
    single = os.path.join(folder, SINGLE)
    if not os.path.isfile(single):
        raise HfError(f"{folder} holds no {SINGLE} or {INDEX}")
    from spindle_dsl.backends.torch.weights import read_header

    return dict.fromkeys(read_header(single), single)
