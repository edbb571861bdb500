"""The launcher's watchdog: a worker still starting is judged by the start-up allowance, one
that has begun stepping by the hang timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from spindle_dsl.backends.torch import launch
from spindle_dsl.errors import ExecutionError


def _worker(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def _beat(path, text: str, age_s: float) -> None:
    path.write_text(text)
    then = time.time() - age_s
    os.utime(path, (then, then))


def test_a_slow_start_is_not_a_hang(tmp_path):
    beat = tmp_path / "heartbeat-0"
    _beat(beat, "starting", age_s=5.0)  # older than the hang timeout, still starting
    proc = _worker(1.0)
    launch._watch([proc], [beat], tmp_path, hang_s=0.5, poll_s=0.05)  # returns: it exited 0
    assert proc.returncode == 0


def test_a_silent_worker_past_its_start_is_a_hang(tmp_path):
    beat = tmp_path / "heartbeat-0"
    _beat(beat, "step 1 wave 0 forward", age_s=5.0)
    proc = _worker(30.0)
    try:
        with pytest.raises(ExecutionError, match=r"rank 0 failed: hung.*step 1 wave 0 forward"):
            launch._watch([proc], [beat], tmp_path, hang_s=0.5, poll_s=0.05)
    finally:
        proc.kill()
        proc.wait()


def test_a_start_that_never_ends_is_a_hang(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "START_TIMEOUT_S", 1.0)
    beat = tmp_path / "heartbeat-0"
    _beat(beat, "starting", age_s=5.0)
    proc = _worker(30.0)
    try:
        with pytest.raises(ExecutionError, match=r"hung, no progress .*last: starting"):
            launch._watch([proc], [beat], tmp_path, hang_s=0.5, poll_s=0.05)
    finally:
        proc.kill()
        proc.wait()
