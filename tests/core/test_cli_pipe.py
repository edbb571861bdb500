"""A reader that closes the pipe early (``spindle check SPEC | head``) is not an error of the
spec: the command stops quietly, with no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_closed_pipe_ends_quietly():
    proc = subprocess.Popen(
        [sys.executable, "-m", "spindle_dsl", "check", str(REPO / "examples" / "qwen_val.spindle")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away before the table is written
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err, err.decode()
    assert proc.returncode in (0, 141), err.decode()
