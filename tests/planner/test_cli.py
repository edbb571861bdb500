"""``spindle plan`` and ``spindle validate`` through the CLI entry point."""

from __future__ import annotations

import json

import pytest

from spindle_dsl.cli import main


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory, spec_dir):
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    spec = spec_dir / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--out", str(out), "--time-limit", "0.5"]) == 0
    return out


def test_plan_prints_table_and_summary(spec_dir, capsys):
    spec = spec_dir / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--scheduler", "paper"]) == 0
    out = capsys.readouterr().out
    assert "wave" in out and "caption/lm" in out
    assert "speed-up" in out and "lower bound" in out and "planning time" in out


def test_plan_json_summary(spec_dir, capsys):
    spec = spec_dir / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--json", "--scheduler", "sequential"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["chosen"] == "sequential"
    assert summary["speedup"]["sequential"] == pytest.approx(1.0)
    assert set(summary["baselines"]) == {"sequential_s", "distmm_s", "optimus_s"}
    assert summary["loss_devices"] == {}  # every sink already ends on every device


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


def test_bad_scheduler_is_a_usage_error(spec_dir):
    spec = spec_dir / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--scheduler", "magic"]) == 2


def test_plan_that_does_not_fit_exits_1(spec_dir, capsys):
    spec = spec_dir / "qwen_val.spindle"
    # one GPU cannot hold QWen-VAL's parameters and optimizer state, whatever the levers
    assert main(["plan", str(spec), "--scheduler", "sequential", "--devices", "1"]) == 1
    assert "do not fit" in capsys.readouterr().err


def test_forced_micro_batches_and_the_memory_summary(spec_dir, tmp_path, capsys):
    spec = spec_dir / "tiny_mm.spindle"
    out = tmp_path / "plan.json"
    args = ["plan", str(spec), "--micro-batches", "2", "--zero-stage", "2", "--out", str(out)]
    assert main([*args, "--time-limit", "0.3", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "memory levers: 2 micro-batches per iteration, ZeRO-2" in text
    assert "peak memory per device" in text and "% of" in text
    data = json.loads(out.read_text())
    assert (data["micro_batches"], data["zero_stage"]) == (2, 2)
    assert main(["validate", str(out)]) == 0
    capsys.readouterr()
    assert main(["plan", str(spec), "--json", "--micro-batches", "2", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["micro_batches"] == 2 and len(summary["memory_bytes"]) == 4


@pytest.mark.parametrize("value", ["0", "two"])
def test_bad_micro_batches_is_a_usage_error(spec_dir, value, capsys):
    spec = spec_dir / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--micro-batches", value]) == 2
    assert "--micro-batches" in capsys.readouterr().err


def test_summary_says_where_the_compute_over_the_lp_goes(spec_dir, capsys):
    spec = spec_dir / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--json", "--scheduler", "paper"]) == 0
    s = json.loads(capsys.readouterr().out)
    compute, lp = s["compute_s"], s["bounds"]["lp_s"]
    assert 0.0 <= s["idle_share"] < 1.0 and 0.0 < s["busy_s"] <= compute * (1 + 1e-9)
    assert main(["plan", str(spec), "--scheduler", "paper"]) == 0
    out = capsys.readouterr().out
    assert f"compute {compute / lp:.2f}x the LP bound" in out
    assert f"{s['busy_s'] / lp:.2f}x the LP's device-seconds" in out
