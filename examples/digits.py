"""Real data end to end: scikit-learn's 8x8 handwritten digits, captioned by their class name.

Run: ``python examples/digits.py [--steps 240] [--out DIR]`` (about a minute on 2 CPU cores).

It writes the digits as a data folder in the on-disk format (``image.npy``: (N, 3, 8, 8)
pixels; ``text.npy``: (N, 6) token ids of "<bos> a handwritten digit seven ."), a spec whose
task says ``data = "..."``, trains it with ``spindle train``'s runtime on 2 worker processes
with checkpoints, exports the trained weights with ``spindle export``'s function, and scores
held-out digits the model never saw: the caption-token accuracy of the one word that depends on
the image (the class name after "digit"), and the held-out caption loss, before and after
training. The data ships inside scikit-learn's wheel, so nothing is downloaded.

The spec's ``train`` block is the recipe: a warmup, cosine decay, gradient clipping, and an
evaluation of the held-out digits (``eval_data``) every 40 steps, which the run logs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

WORDS = ("<bos>", "a", "handwritten", "digit", ".")
NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
VOCAB = (*WORDS, *NAMES)
CLASS_POSITION = 4  # "<bos> a handwritten digit NAME ." : the token that depends on the image
HELD_OUT = 297  # of 1,797 digits; the other 1,500 train

SPEC = """\
# scikit-learn's handwritten digits, each an 8x8 image (4x4 patches: 4 tokens) with a caption
cluster { devices = 2; device = "cpu" }

modality image { tokens = 4 }
modality text  { tokens = 6; vocab = 15 }

encoder vision : vit(layers = 2, hidden = 64, heads = 4, patch = 4) <- image
module  proj   : mlp(in = 64, out = 64)
shared  lm     : transformer(layers = 2, hidden = 64, heads = 4, ffn = 128, act = "swiglu",
                             norm = "rmsnorm", bias = false, pos = "rotary", causal = true,
                             vocab = 15, tie_embeddings = true)

task caption {
  image -> vision -> proj -> lm
  text -> lm
  loss = lm
  batch = 64
  data = "data/caption"
  eval_data = "held_out/caption"
}

train {
  steps        = 240
  lr           = 3e-3
  warmup_steps = 20
  lr_decay     = "cosine"
  min_lr       = 3e-4
  clip_grad    = 1.0
  eval_every   = 40
  eval_batches = 4  # 4 x 64 of the 297 held-out digits
}
"""


def caption_ids(label: int) -> list[int]:
    words = ("<bos>", "a", "handwritten", "digit", NAMES[label], ".")
    return [VOCAB.index(w) for w in words]


def write_digits(root: Path, seed: int = 0) -> tuple[Path, Path]:
    """The digits as two data folders (train, held out), shuffled once with ``seed``: the
    runtime reads a folder in order, so the order written is the order trained."""
    from sklearn.datasets import load_digits

    from spindle_dsl.backends.torch.datafiles import write_task_folder

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    pixels = (digits.images[order] / 16.0).astype(np.float32)  # grey levels 0..16 -> [0, 1]
    images = np.repeat(pixels[:, None], 3, axis=1)  # (N, 3, 8, 8): the vit reads RGB patches
    text = np.array([caption_ids(int(y)) for y in digits.target[order]], dtype=np.int64)
    train, held = root / "data" / "caption", root / "held_out" / "caption"
    write_task_folder(train, {"image": images[HELD_OUT:], "text": text[HELD_OUT:]})
    write_task_folder(held, {"image": images[:HELD_OUT], "text": text[:HELD_OUT]})
    return train, held


@dataclass(frozen=True)
class Score:
    """Held-out figures of one set of weights."""

    accuracy: float  # share of held-out digits whose class word is the model's top token
    loss: float  # mean next-token cross-entropy of the held-out captions


def score(graph, weights: Path | None, held_out: Path) -> Score:
    """Load ``weights`` (None: the initial model) into the single-process reference model and
    score every held-out digit."""
    from spindle_dsl.backends.torch import ReferenceModel

    model = ReferenceModel(graph, datasets={"caption": str(held_out)})
    if weights is not None:
        model.load_weights(str(weights))
    n = len(model.data.sources["caption"])
    with torch.no_grad():
        logits = model.lm_logits("caption", 0, n)  # position i predicts text token i + 1
        ids = model.data.rows_at("caption", 0, 0, n)["text"]
    predicted = logits[:, CLASS_POSITION - 1].argmax(-1)
    accuracy = float((predicted == ids[:, CLASS_POSITION]).float().mean())
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].reshape(-1))
    return Score(accuracy, float(loss))


@dataclass(frozen=True)
class Result:
    losses: tuple[float, ...]  # the training loss of every step
    eval_losses: tuple[tuple[int, float], ...]  # (step, held-out loss) where the run evaluated
    before: Score
    after: Score
    seconds: float  # wall time of the training run


def run(steps: int | None, out: Path, nproc: int = 2, lr: float | None = None) -> Result:
    """Write the data, train ``steps`` steps (None: the train block's) on ``nproc``
    processes with the spec's recipe (``lr`` overriding its rate), export, score."""
    from spindle_dsl.backends.base import RunConfig
    from spindle_dsl.backends.torch import TorchBackend
    from spindle_dsl.backends.torch.export import export_model
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.language import compile_file
    from spindle_dsl.planner import make_plan

    out.mkdir(parents=True, exist_ok=True)
    _, held_out = write_digits(out)
    spec = out / "digits.spindle"
    spec.write_text(SPEC)
    overrides = {k: v for k, v in (("steps", steps), ("lr", lr)) if v is not None}
    compiled = compile_file(spec, train_overrides=overrides)
    graph = compiled.graph
    plan = make_plan(graph, make_cost_model(graph.cluster))
    before = score(graph, None, held_out)
    config = RunConfig(
        **compiled.train.run_fields(),
        checkpoint_dir=str(out / "ckpt"),
        resume=False,
        progress=False,
    )
    result = TorchBackend().train(graph, plan, config, nproc=nproc)  # eval_data: the spec's
    weights = out / "digits.safetensors"
    export_model(graph, weights, checkpoint_dir=out / "ckpt")
    after = score(graph, weights, held_out)
    losses = tuple(r.loss("caption") for r in result.steps)
    held = tuple((r.step, dict(r.eval_losses)["caption"]) for r in result.steps if r.eval_losses)
    return Result(losses, held, before, after, sum(r.seconds for r in result.steps))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the spec's, 240)")
    parser.add_argument("--out", help="working folder (default: a new temporary one)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="spindle-digits-"))
    r = run(args.steps, out)
    first, last = r.losses[0], sum(r.losses[-10:]) / len(r.losses[-10:])
    print(f"data, spec, checkpoints and weights in {out}")
    print(f"training loss: step 1 {first:.3f}, mean of the last 10 steps {last:.3f}")
    print(
        "held-out loss during the run: " + ", ".join(f"step {s} {v:.3f}" for s, v in r.eval_losses)
    )
    print(
        f"held-out ({HELD_OUT} digits): class-word accuracy {r.before.accuracy:.1%} -> "
        f"{r.after.accuracy:.1%}, caption loss {r.before.loss:.3f} -> {r.after.loss:.3f}"
    )
    print(f"{len(r.losses)} steps in {r.seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
