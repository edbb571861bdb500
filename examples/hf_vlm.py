"""A small LLaVA-style job from Hugging Face folders: a frozen SigLIP vision tower, an adapter and
a Qwen2-style language model, trained on captioned handwritten digits and handed back to
transformers.

Run: ``python examples/hf_vlm.py [--steps 400] [--out DIR]`` (under a minute on 2 CPU cores;
needs transformers and scikit-learn, both in the ``examples`` and ``dev`` extras).

1. transformers builds the two models from configs (no download) and saves them with
   ``save_pretrained``, as a downloaded checkpoint looks: ``hf/siglip`` (image 8x8, patch 4:
   four tokens) and ``hf/qwen2`` (a 15-word vocabulary, tied embeddings).
2. The spec reads them with ``hf("hf/siglip")`` and ``hf("hf/qwen2")``; an ``mlp`` adapter
   joins them. scikit-learn's 8x8 digits are captioned "<bos> a handwritten digit seven ."
   (``examples/digits.py``'s data) and ``spindle train`` trains the adapter and the LM on 2
   processes, the tower frozen.
3. ``spindle export --format hf`` writes each module: ``export/vision`` and ``export/lm`` as
   Hugging Face folders, ``export/proj`` in the project's format.
4. transformers loads the exported folders (``SiglipVisionModel``, ``Qwen2ForCausalLM``), runs
   the image tokens through the adapter into the LM's input embeddings, and scores the 297
   held-out captions: the caption loss and the accuracy of the class word, before and after
   training (the same figures from the project's own model, for comparison).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits import CLASS_POSITION, HELD_OUT, VOCAB, write_digits

WIDTH = 64
SPEC = """\
# a frozen SigLIP tower, an adapter and a Qwen2-style LM, all but the adapter from HF folders
cluster { devices = 2; device = "cpu" }

modality image { tokens = 4 }
modality text  { tokens = 6; vocab = 15 }

encoder vision : hf("hf/siglip") <- image frozen
module  proj   : mlp(in = 64, out = 64)
module  lm     : hf("hf/qwen2")

task caption {
  image -> vision -> proj -> lm
  text -> lm
  loss = lm
  batch = 64
  data = "data/caption"
}
"""


def make_folders(root: Path, seed: int = 0) -> None:
    """The two models as transformers builds them from configs, saved as folders."""
    import transformers as T

    torch.manual_seed(seed)
    vision = T.SiglipVisionConfig(
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=8,
        patch_size=4,
    )
    T.SiglipVisionModel(vision).save_pretrained(root / "hf" / "siglip")
    lm = T.Qwen2Config(
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(VOCAB),
        max_position_embeddings=16,
        tie_word_embeddings=True,
    )
    T.Qwen2ForCausalLM(lm).save_pretrained(root / "hf" / "qwen2")


@dataclass(frozen=True)
class Score:
    """Held-out figures of one set of weights."""

    loss: float  # mean next-token cross-entropy of the held-out captions
    accuracy: float  # share of held-out digits whose class word is the top token


def hf_score(vision_dir: Path, lm_dir: Path, adapter: torch.nn.Module, held: Path) -> Score:
    """The held-out captions through transformers' models: the tower's tokens, the adapter,
    then the LM on [image tokens, caption embeddings]; the loss over the caption's next
    tokens, as the spec's lm loss counts it."""
    import transformers as T

    vision = T.SiglipVisionModel.from_pretrained(vision_dir).eval()
    lm = T.Qwen2ForCausalLM.from_pretrained(lm_dir).eval()
    images = torch.from_numpy(np.load(held / "image.npy"))
    text = torch.from_numpy(np.load(held / "text.npy"))
    with torch.no_grad():
        prefix = adapter(vision(pixel_values=images).last_hidden_state)
        embeds = torch.cat((prefix, lm.get_input_embeddings()(text)), dim=1)
        logits = lm(inputs_embeds=embeds).logits[:, prefix.shape[1] : -1]
    return _score(logits, text)


def _score(logits: torch.Tensor, text: torch.Tensor) -> Score:
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), text[:, 1:].reshape(-1))
    hit = logits[:, CLASS_POSITION - 1].argmax(-1) == text[:, CLASS_POSITION]
    return Score(float(loss), float(hit.float().mean()))


def spindle_score(graph, weights: Path | None, held: Path) -> Score:
    """The same figures from the project's single-process model."""
    from spindle_dsl.backends.torch import ReferenceModel

    model = ReferenceModel(graph, datasets={"caption": str(held)})
    if weights is not None:
        model.load_weights(str(weights))
    n = len(np.load(held / "text.npy"))
    with torch.no_grad():
        logits = model.lm_logits("caption", 0, n)
        text = model.data.rows_at("caption", 0, 0, n)["text"]
    return _score(logits, text)


def load_adapter(path: Path) -> torch.nn.Linear:
    """The exported adapter (the project's format: ``proj.layer.0.net.*``) as a linear layer."""
    from safetensors.torch import load_file

    state = load_file(path)
    adapter = torch.nn.Linear(WIDTH, WIDTH)
    adapter.load_state_dict(
        {"weight": state["proj.layer.0.net.weight"], "bias": state["proj.layer.0.net.bias"]}
    )
    return adapter


@dataclass(frozen=True)
class Result:
    first_loss: float  # the training loss of step 1
    last_loss: float  # of the last step
    before: Score  # held out, transformers, the folders as built
    after: Score  # held out, transformers, the exported folders
    spindle_after: Score  # held out, the project's model, the trained checkpoint
    out: Path


def run(steps: int, out: Path, nproc: int = 2, lr: float = 3e-3) -> Result:
    """Build the folders, write the data, train, export, score (see the module docstring)."""
    from spindle_dsl.backends.torch.export import export_model
    from spindle_dsl.cli import main
    from spindle_dsl.language import compile_file

    out.mkdir(parents=True, exist_ok=True)
    make_folders(out)
    _, held = write_digits(out)
    spec = out / "hf_vlm.spindle"
    spec.write_text(SPEC)
    graph = compile_file(spec).graph
    initial = out / "initial.safetensors"
    export_model(graph, initial)  # the adapter's seeded start, for the "before" figures
    before = hf_score(out / "hf/siglip", out / "hf/qwen2", load_adapter(initial), held)
    log, ckpt, exported = out / "log.jsonl", out / "ckpt", out / "export"
    train = ["train", str(spec), "--steps", str(steps), "--lr", str(lr), "--nproc", str(nproc)]
    if main([*train, "--checkpoint-dir", str(ckpt), "--log-json", str(log), "--no-progress"]):
        raise SystemExit("training failed")
    export = ["export", str(spec), "--format", "hf", "-o", str(exported)]
    if main([*export, "--checkpoint-dir", str(ckpt)]):
        raise SystemExit("export failed")
    adapter = load_adapter(exported / "proj" / "weights.safetensors")
    after = hf_score(exported / "vision", exported / "lm", adapter, held)
    trained = out / "trained.safetensors"
    export_model(graph, trained, checkpoint_dir=ckpt)
    losses = [_loss(line) for line in log.read_text().splitlines()]
    return Result(losses[0], losses[-1], before, after, spindle_score(graph, trained, held), out)


def _loss(line: str) -> float:
    import json

    return float(json.loads(line)["loss"]["caption"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps (default: 400)")
    parser.add_argument("--out", help="working folder (default: a new temporary one)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from configs, never the hub
    r = run(args.steps, Path(args.out or tempfile.mkdtemp(prefix="spindle-hf-vlm-")))
    print(f"folders, data, checkpoints and exports in {r.out}")
    print(f"training loss: step 1 {r.first_loss:.3f}, step {args.steps} {r.last_loss:.3f}")
    print(
        f"held-out ({HELD_OUT} captions) through transformers: caption loss "
        f"{r.before.loss:.3f} -> {r.after.loss:.3f}, class-word accuracy "
        f"{r.before.accuracy:.1%} -> {r.after.accuracy:.1%}"
    )
    print(
        f"the project's own model on the same captions: loss {r.spindle_after.loss:.3f}, "
        f"accuracy {r.spindle_after.accuracy:.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
