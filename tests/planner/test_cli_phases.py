"""``spindle plan`` on a scheduled spec: a table of phases, a bundle, per-phase traces."""

from __future__ import annotations

import json
import re

from spindle_dsl.cli import main
from spindle_dsl.render.trace import check_trace


def test_plan_writes_a_bundle_that_validates(tmp_path, spec_dir, capsys):
    spec = spec_dir / "next" / "tiny_schedule.spindle"
    out, trace = tmp_path / "bundle.json", tmp_path / "t.json"
    args = ["plan", str(spec), "--scheduler", "paper", "--out", str(out), "--trace", str(trace)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "phase 2: mix caption_only from step 3" in printed  # its wave table follows
    rows = [line.split() for line in printed.splitlines() if re.match(r"\s+\d+\s+\d+-", line)]
    assert [r[:3] for r in rows] == [
        ["1", "0-2", "warmup"],
        ["2", "3-5", "caption_only"],
        ["3", "6-", "balanced"],
    ]
    assert all(r[7].endswith("x") for r in rows)  # speed-up over sequential
    assert main(["validate", str(out)]) == 0
    assert "valid bundle (3 phases" in capsys.readouterr().out
    for k in (1, 2, 3):
        assert check_trace(json.loads((tmp_path / f"t-phase{k}.json").read_text())) == []
    assert main(["plan", str(spec), "--scheduler", "paper", "--json", "--jobs", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["mix"] for p in data["phases"]] == ["warmup", "caption_only", "balanced"]
    assert all(p["iteration_s"] > 0 and p["peak_memory_bytes"] > 0 for p in data["phases"])
    assert data["planning"]["worker_processes"] == 0
    # --mix sets the schedule aside: one plan
    assert main(["plan", str(spec), "--scheduler", "paper", "--mix", "balanced", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mix"] == "balanced"
