"""The prepared GPU checks (bench/gpu_check.sh, bench/gpu_wheels.sh) parse, and without a CUDA
device the check stops at once with a message, writing its log where the device tool collects
files; the run itself needs a GPU (docs/benchmarks.md, "GPU")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ("bench/gpu_check.sh", "bench/gpu_wheels.sh", "bench/train_gpu.sh")


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_gpu_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device would run the checks")
def test_without_cuda_the_check_stops_with_a_message(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PY": sys.executable, "WORK": str(tmp_path / "w")}
    done = subprocess.run(
        ["bash", str(REPO / "bench/gpu_check.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "no torch with a CUDA device here" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert "no torch with a CUDA device here" in (tmp_path / "gpu_check.log").read_text()
