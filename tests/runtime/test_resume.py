"""Resuming from a checkpoint: bit-exact on the same plan, and on another plan and world size."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import handgraph as h
import pytest
import torch
from runtime_helpers import checkpoint_state, worst_relative

from spindle_dsl.backends.torch import ReferenceModel

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def _run(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(HERE / "run_job.py"), *args],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _from_step(src: Path, dst: Path, step: int) -> Path:
    """A copy of checkpoint folder ``src`` whose newest checkpoint is ``step``."""
    name = f"step-{step:06d}"
    shutil.copytree(src / name, dst / name)
    (dst / "latest").write_text(name + "\n")
    return dst


def test_resume_is_exact_on_the_same_plan_and_matches_on_two_processes(tmp_path):
    full = tmp_path / "full"
    first = _run("--world", "4", "--steps", "5", "--checkpoint-every", "3",
                 "--checkpoint-dir", str(full))  # fmt: skip
    assert first["resumed"] == 0 and len(first["steps"]) == 5
    assert sorted(p.name for p in full.iterdir()) == ["latest", "step-000003", "step-000005"]

    # same plan, same 4 ranks, from step 3: bit for bit the uninterrupted run
    same = _from_step(full, tmp_path / "same", 3)
    again = _run("--world", "4", "--steps", "5", "--checkpoint-dir", str(same))
    assert again["resumed"] == 3 and [s["step"] for s in again["steps"]] == [4, 5]
    timed = ("seconds", "tokens_per_s", "samples_per_s", "mfu")  # the rest must be equal
    assert again["steps"] == [
        {**s, **{k: a[k] for k in timed}}
        for s, a in zip(first["steps"][3:], again["steps"], strict=True)
    ]
    want, got = checkpoint_state(full), checkpoint_state(same)
    assert all(torch.equal(want[k][n], got[k][n]) for k in want for n in want[k])

    # another plan (sequential) on 2 ranks, from the 4-rank checkpoint
    moved = _from_step(full, tmp_path / "moved", 3)
    two = _run("--world", "2", "--plan", "sequential", "--steps", "5",
               "--checkpoint-dir", str(moved))  # fmt: skip
    assert two["resumed"] == 3
    for a, b in zip(first["steps"][3:], two["steps"], strict=True):
        for task, value in a["loss"].items():
            assert b["loss"][task] == pytest.approx(value, rel=1e-12)
    assert worst_relative(want, checkpoint_state(moved))[0] < 1e-9
    ref = ReferenceModel(h.tiny_mm(2), dtype="float64")
    ref.train(5)
    assert worst_relative(ref.state(), checkpoint_state(moved))[0] < 1e-9
