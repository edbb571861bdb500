"""examples/digits.py without training (the digits notebook, executed by tests/notebooks,
trains it): the data folders it writes, the captions, and its spec reading them, with its
recipe (warmup, cosine decay, clipping, evaluation of the held-out digits)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the digits example needs scikit-learn (the dev extra)")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits.py"
_spec = importlib.util.spec_from_file_location("digits_example", EXAMPLE)
digits = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = digits  # its dataclasses look their module up there
_spec.loader.exec_module(digits)


def test_digits_are_written_as_data_folders_the_spec_reads(tmp_path):
    from spindle_dsl.backends.torch.data import TaskData
    from spindle_dsl.language import compile_file

    train, held = digits.write_digits(tmp_path)
    images, text = np.load(train / "image.npy"), np.load(train / "text.npy")
    assert images.shape == (1500, 3, 8, 8) and images.dtype == np.float32
    assert images.min() >= 0.0 and images.max() == 1.0
    assert text.shape == (1500, 6) and len(np.load(held / "text.npy")) == digits.HELD_OUT
    words = [digits.VOCAB[i] for i in text[0]]
    assert words[:4] == ["<bos>", "a", "handwritten", "digit"] and words[5] == "."
    assert set(text[:, digits.CLASS_POSITION]) == {digits.VOCAB.index(n) for n in digits.NAMES}
    spec = tmp_path / "digits.spindle"
    spec.write_text(digits.SPEC)
    compiled = compile_file(spec)
    graph = compiled.graph
    assert graph.task("caption").data == str(train)
    assert graph.task("caption").eval_data == str(held)  # evaluated while it trains
    recipe = compiled.train
    assert (recipe.warmup_steps, recipe.lr_decay, recipe.clip_grad) == (20, "cosine", 1.0)
    assert recipe.eval_every == 40 and recipe.eval_batches * 64 <= digits.HELD_OUT
    rows = TaskData(graph, 0).rows_at("caption", 0, 0, 2)
    assert rows["image"].shape == (2, 4, 48)  # four 4x4 RGB patches per digit
    assert rows["text"].tolist() == text[:2].tolist()
