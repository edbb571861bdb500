"""examples/hf_vlm.py in short (a few steps on one process): transformers' folders in, the job
trained, the modules exported, and transformers' reading of the export scoring the held-out
captions exactly as the project's own model does."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn", reason="the example needs scikit-learn (the dev extra)")
pytest.importorskip("transformers", reason="the example needs transformers (the dev extra)")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_vlm.py"
_spec = importlib.util.spec_from_file_location("hf_vlm_example", EXAMPLE)
hf_vlm = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = hf_vlm  # its dataclasses look their module up there
_spec.loader.exec_module(hf_vlm)


def test_the_example_trains_exports_and_transformers_reads_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = hf_vlm.run(steps=6, out=tmp_path, nproc=1)
    assert r.last_loss < r.first_loss  # it learns
    assert r.after.loss < r.before.loss
    # transformers, reading the exported folders, computes the project's own held-out figures
    assert r.after.loss == pytest.approx(r.spindle_after.loss, rel=1e-5)
    assert r.after.accuracy == r.spindle_after.accuracy
    for name in ("vision", "lm"):
        assert sorted(os.listdir(tmp_path / "export" / name)) == [
            "config.json",
            "model.safetensors",
        ]
    assert os.listdir(tmp_path / "export" / "proj") == ["weights.safetensors"]
