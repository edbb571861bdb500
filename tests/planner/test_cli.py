"""``spindle plan`` and ``spindle validate`` through the CLI entry point."""

from __future__ import annotations

import json

import pytest

from spindle_dsl.cli import main

pytest.importorskip("spindle_dsl.language")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory, shared_dir):
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    spec = shared_dir / "spec" / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--out", str(out), "--time-limit", "0.5"]) == 0
    return out


def test_plan_prints_table_and_summary(shared_dir, capsys):
    spec = shared_dir / "spec" / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--scheduler", "paper"]) == 0
    out = capsys.readouterr().out
    assert "wave" in out and "caption/lm" in out
    assert "speed-up" in out and "lower bound" in out and "planning time" in out


def test_plan_json_summary(shared_dir, capsys):
    spec = shared_dir / "spec" / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--json", "--scheduler", "sequential"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["chosen"] == "sequential"
    assert summary["speedup"]["sequential"] == pytest.approx(1.0)
    assert set(summary["baselines"]) == {"sequential_s", "distmm_s", "optimus_s"}


def test_written_plan_validates(plan_file, capsys):
    assert main(["validate", str(plan_file)]) == 0
    assert "valid" in capsys.readouterr().out


def test_broken_plan_fails_validation(plan_file, tmp_path, capsys):
    data = json.loads(plan_file.read_text())
    data["waves"][0]["entries"][0]["devices"] = [99]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "outside [0, 4)" in err and "broken invariant" in err


def test_unreadable_plans_are_errors_not_tracebacks(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing.json")]) == 1
    (tmp_path / "junk.json").write_text("{not json")
    assert main(["validate", str(tmp_path / "junk.json")]) == 1
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    assert main(["validate", str(tmp_path / "other.json")]) == 1
    err = capsys.readouterr().err
    assert "cannot read plan" in err and "invalid JSON" in err and "not a spindle-plan" in err


def test_bad_scheduler_is_a_usage_error(shared_dir):
    spec = shared_dir / "spec" / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--scheduler", "magic"]) == 2


def test_plan_that_does_not_fit_exits_1(shared_dir, capsys):
    spec = shared_dir / "spec" / "qwen_val.spindle"
    # 8 GPUs cannot hold QWen-VAL even with activation recompute everywhere
    assert main(["plan", str(spec), "--scheduler", "sequential", "--devices", "8"]) == 1
    assert "do not fit" in capsys.readouterr().err
