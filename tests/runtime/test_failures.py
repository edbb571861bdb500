"""A worker that dies or hangs stops every rank, with a message naming it, and leaves no process.

The run is started as a separate process (the way a user starts ``spindle train --nproc``), so
the test can see its worker processes, kill or freeze one mid-run, and check what is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def _workers(pid: int) -> dict[int, int]:
    """rank -> pid of the launcher's worker processes."""
    out = {}
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for child in map(int, children):
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                out[int(item[5:])] = child
    return out


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "log.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "run_job.py"), "--world", "4", "--steps", "400",
         "--delay", "0.2", "--log-json", str(log), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text().count("\n") >= 2):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never got going"
        time.sleep(0.2)
    return proc, log


def _skip_without_proc() -> None:
    if not Path("/proc/self/task").is_dir() or sys.platform != "linux":
        pytest.skip("finds worker processes through /proc (Linux)")


@pytest.mark.parametrize(("how", "rank"), [("kill", 2), ("freeze", 1)])
def test_a_dead_or_hung_worker_stops_every_rank(tmp_path, how, rank):
    _skip_without_proc()
    # 20 s: a wave of a step on 4 workers sharing 2 busy cores can stall for seconds (the
    # start itself has its own allowance, launch.START_TIMEOUT_S)
    proc, _ = _start(tmp_path, "--hang-timeout", "20")
    workers = _workers(proc.pid)
    assert sorted(workers) == [0, 1, 2, 3]
    t0 = time.monotonic()
    os.kill(workers[rank], signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in workers.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, (out, err)
    cause = "killed by signal SIGKILL" if how == "kill" else "hung, no progress for"
    assert f"rank {rank} failed: {cause}" in err, err
    assert "Traceback" not in err.split(f"rank {rank} failed")[1]
    assert elapsed < 60, elapsed
    assert not [pid for pid in workers.values() if _alive(pid)], "orphan workers left"
