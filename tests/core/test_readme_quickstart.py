"""The README's quickstart runs as written: every command of its ``bash`` blocks, in short
versions (fewer steps, fewer devices), from a scratch folder beside the bundled examples.

A command that the README shows but this test cannot run would drift unnoticed, so the
shortening is a small table of substitutions, each of which must apply to some command."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

# long-running arguments and their short versions; every one must match a quickstart command
SHORTER = {
    "--steps 20": "--steps 2",
    "--devices 32": "--devices 8",
}


def quickstart_commands(text: str) -> list[str]:
    """The shell commands of the ``bash`` blocks under the README's "Quickstart" heading,
    comments dropped, without the virtual environment's activation."""
    section = re.search(r"^## Quickstart\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## Quickstart' section"
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section.group(1), re.S):
        for line in block.splitlines():
            command = line.split("#", 1)[0].strip()
            if command and not command.startswith((". ", "source ")):
                commands.append(command)
    return commands


def shortened(commands: list[str]) -> list[str]:
    out = []
    for command in commands:
        for long, short in SHORTER.items():
            command = command.replace(long, short)
        out.append(command)
    return out


def test_quickstart_is_found_and_every_shortening_applies():
    commands = quickstart_commands(README.read_text())
    assert any(c.startswith("spindle train") for c in commands), commands
    assert any(c.startswith("spindle plan") for c in commands), commands
    for long in SHORTER:
        assert any(long in c for c in commands), f"{long!r} is in no quickstart command"


@pytest.mark.slow
def test_quickstart_commands_run(tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    spindle = [sys.executable, "-m", "spindle_dsl"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for command in shortened(quickstart_commands(README.read_text())):
        argv = shlex.split(command)
        assert argv[0] == "spindle", f"the quickstart runs spindle commands only: {command}"
        proc = subprocess.run(
            spindle + argv[1:], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr
    for written in ("plan.json", "waves.svg", "report.html", "log.jsonl"):
        assert (tmp_path / written).stat().st_size > 0, written
