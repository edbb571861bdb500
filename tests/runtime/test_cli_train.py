"""``spindle train`` end to end: spawning, the JSON log, the trace, the summary, and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spindle_dsl.cli import main
from spindle_dsl.render.trace import check_trace


@pytest.mark.slow
def test_train_writes_log_trace_checkpoint_and_summary(tmp_path, spec_dir, capfd):
    log, trace, ckpt = tmp_path / "log.jsonl", tmp_path / "trace.json", tmp_path / "ckpt"
    spec = str(spec_dir / "tiny_mm.spindle")
    micro_batches, stage = 2, 2  # what the run asks for, and its summary must report
    code = main(
        ["train", spec, "--nproc", "2", "--steps", "2", "--log-json", str(log),
         "--trace", str(trace), "--checkpoint-dir", str(ckpt), "--scheduler", "paper",
         "--recompute", "all", "--micro-batches", str(micro_batches),
         "--zero-stage", str(stage),
         "--summary-json", str(tmp_path / "s.json")]
    )  # fmt: skip
    out, err = capfd.readouterr()
    assert code == 0, err
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    for x in lines:
        assert set(x) == {"step", "mix", "loss", "lr", "grad_norm", "seconds", "tokens_per_s",
                          "samples_per_s", "mfu"} and x["mix"] == "default"  # fmt: skip
        assert set(x["loss"]) == {"caption", "transcribe"}
        assert x["seconds"] > 0 and all(4 < v < 8 for v in x["loss"].values())  # ~ln(512)
    assert "plan: paper" in out and "measured" in out and "predicted" in out
    assert "optimizer state per rank:" in out
    assert "where the time goes" in out and "largest misses" in out  # predicted vs measured
    assert "peak memory" in out and "rank 1" in out
    summary = json.loads((tmp_path / "s.json").read_text())
    assert (summary["micro_batches"], summary["zero_stage"]) == (micro_batches, stage)
    assert len(summary["measured_peak_bytes"]) == len(summary["predicted_peak_bytes"]) == 2
    assert all(m > 0 for m in summary["measured_peak_bytes"])
    assert all(p > 0 for p in summary["predicted_peak_bytes"])  # the planner predicts them
    assert summary["measured_peak_terms"][0]["parameters"] > 0
    assert "step 2/2" in err  # the progress line
    events = json.loads(trace.read_text())
    assert check_trace(events) == []
    assert {e["tid"] for e in events["traceEvents"] if e["ph"] == "X"} == {0, 1}
    assert (ckpt / "latest").read_text().strip() == "step-000002"
    # a second run resumes at step 2 and has nothing left to do
    assert main(["train", spec, "--nproc", "2", "--steps", "2", "--checkpoint-dir", str(ckpt),
                 "--no-progress", "--optimizer-sharding", "off",
                 "--recompute", "none"]) == 0  # fmt: skip
    out = capfd.readouterr().out
    assert "resumed from step 2" in out and "nothing to do" in out


def test_a_plan_for_other_devices_is_refused_before_spawning(tmp_path, spec_dir, capfd):
    spec = str(spec_dir / "tiny_mm.spindle")
    plan = tmp_path / "plan.json"
    assert main(["plan", spec, "--out", str(plan), "--quiet"]) == 0
    capfd.readouterr()
    assert main(["train", spec, "--plan", str(plan), "--nproc", "3", "--steps", "1"]) == 1
    err = capfd.readouterr().err
    assert "the plan is for 4 devices but 3 processes run it" in err
    assert "Traceback" not in err


def test_conflicting_memory_flags_are_refused_before_spawning(spec_dir, capfd):
    spec = str(spec_dir / "tiny_mm.spindle")
    args = ["train", spec, "--nproc", "2", "--steps", "1", "--no-progress"]
    assert main([*args, "--zero-stage", "2", "--optimizer-sharding", "off"]) == 1
    err = capfd.readouterr().err
    assert "--zero-stage" in err and "--optimizer-sharding off" in err and "Traceback" not in err
    assert main([*args, "--micro-batches", "0"]) == 1
    assert "micro_batches must be at least 1" in capfd.readouterr().err


def test_a_gpu_spec_without_a_launcher_says_how_to_start(spec_dir, capfd):
    spec = str(spec_dir / "multitask_clip.spindle")
    assert main(["train", spec, "--steps", "1"]) == 1
    err = capfd.readouterr().err
    assert "torchrun" in err and "--nproc" in err


@pytest.mark.slow
def test_under_torchrun_each_process_becomes_a_rank(tmp_path, spec_dir):
    import subprocess
    import sys

    log = tmp_path / "log.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "spindle_dsl", "train", str(spec_dir / "tiny_mm.spindle"),
         "--steps", "2", "--log-json", str(log), "--no-progress", "--run-on", "cpu"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "trained 2 steps on 2 ranks (gloo)" in done.stdout
    assert done.stdout.count("trained 2 steps") == 1  # only rank 0 reports
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1, 2]


def _capture_plans(monkeypatch) -> list:
    """Stand in for the backend: plan as ``spindle train`` would, run nothing."""
    from spindle_dsl.backends import torch as backend

    made: list = []

    def fake_train(self, graph, plan, config, *, planner=None, **_):
        made.append(planner() if plan is None else plan)
        made.append(config)

    monkeypatch.setattr(backend.TorchBackend, "train", fake_train)
    return made


def test_train_plans_with_the_levers_it_runs(monkeypatch, spec_dir) -> None:
    """--micro-batches and --zero-stage reach the planner as well as the runtime, so the
    predicted step and memory are for what runs; a schedule's every phase alike."""
    from spindle_dsl.backends.torch.trainer import zero_stage

    made = _capture_plans(monkeypatch)
    spec = str(spec_dir / "tiny_mm.spindle")
    base = ["train", "--nproc", "4", "--steps", "1", "--no-progress", "--scheduler", "paper"]
    assert main([*base[:1], spec, *base[1:], "--micro-batches", "2", "--zero-stage", "2"]) == 0
    plan, config = made
    assert (plan.micro_batches, plan.zero_stage) == (2, 2)
    assert (config.micro_batches, config.zero_stage) == (plan.micro_batches, plan.zero_stage)
    assert zero_stage(plan, config) == plan.zero_stage  # the stage the trainer runs
    made.clear()
    assert main([*base[:1], spec, *base[1:], "--optimizer-sharding", "off"]) == 0
    plan, config = made
    assert plan.zero_stage == 0  # what runs without optimizer sharding
    assert zero_stage(plan, config) == plan.zero_stage
    made.clear()
    scheduled = str(Path(__file__).parents[2] / "examples" / "tiny_schedule.spindle")
    assert main([*base[:1], scheduled, *base[1:], "--micro-batches", "2"]) == 0
    assert {p.plan.micro_batches for p in made[0].phases} == {2}


def test_levers_that_override_a_plan_are_warned_about(tmp_path, spec_dir, capfd) -> None:
    spec = str(spec_dir / "tiny_mm.spindle")
    plan = tmp_path / "plan.json"
    assert main(["plan", spec, "--out", str(plan), "--quiet", "--micro-batches", "1"]) == 0
    capfd.readouterr()
    # refused for its device count, after the warning
    args = ["train", spec, "--plan", str(plan), "--nproc", "3", "--steps", "1"]
    stage = json.loads(plan.read_text())["zero_stage"]
    assert main([*args, "--micro-batches", "3", "--zero-stage", str(stage)]) == 1
    err = capfd.readouterr().err
    assert "--micro-batches 3 overrides the plan's micro_batches 1" in err
    assert "overrides the plan's zero_stage" not in err  # the same as the plan's: no warning
    assert "the plan is for 4 devices but 3 processes run it" in err
