"""``spindle train`` on tiny_schedule end to end (float32): the log follows the schedule, two
processes give the same losses, and a run stopped in a phase resumes in it."""

from __future__ import annotations

import json

import pytest

from spindle_dsl.cli import main
from spindle_dsl.render.trace import check_trace

MIXES = ["warmup"] * 3 + ["caption_only"] * 3 + ["balanced"] * 2


def _log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _close(a: dict, b: dict, rel: float) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= rel * abs(a[k]) for k in a)


@pytest.mark.slow
def test_train_follows_the_schedule_on_4_and_2_processes_and_resumes_in_a_phase(
    tmp_path, spec_dir, capfd
):
    spec = str(spec_dir / "next" / "tiny_schedule.spindle")
    bundle = tmp_path / "bundle.json"
    assert main(["plan", spec, "--out", str(bundle), "--quiet"]) == 0
    log, trace = tmp_path / "L.jsonl", tmp_path / "trace.json"
    assert main(["train", spec, "--plan", str(bundle), "--nproc", "4", "--steps", "8",
                 "--log-json", str(log), "--trace", str(trace)]) == 0  # fmt: skip
    out, err = capfd.readouterr()
    lines = _log(log)
    assert [x["mix"] for x in lines] == MIXES
    assert [x["step"] for x in lines] == list(range(1, 9))
    assert all(set(x["loss"]) == {"caption"} for x in lines[3:6])  # steps 4-6
    assert all(set(x["loss"]) == {"caption", "transcribe"} for x in lines[:3] + lines[6:])
    assert [x["step"] for x in lines if "switch_s" in x] == [4, 7]
    assert "switched to mix caption_only (phase 2 of 3) before step 4 in" in err
    assert "balanced" in out and "switch into it" in out  # the summary's table of phases
    events = json.loads(trace.read_text())
    assert check_trace(events) == []
    switches = [e for e in events["traceEvents"] if e.get("cat") == "switch"]
    assert {e["tid"] for e in switches} == {0, 1, 2, 3} and len(switches) == 8

    # two processes, planning the phases themselves: the same losses (float32)
    two = tmp_path / "L2.jsonl"
    assert main(["train", spec, "--devices", "2", "--steps", "8", "--log-json", str(two),
                 "--no-progress"]) == 0  # fmt: skip
    pairs = list(zip(lines, _log(two), strict=True))
    assert all(_close(a["loss"], b["loss"], 1e-4) for a, b in pairs), pairs

    # 4 steps with a checkpoint folder, then 8 with the same: the uninterrupted run's losses
    ckpt, part = tmp_path / "ckpt", tmp_path / "L3.jsonl"
    common = ["--plan", str(bundle), "--nproc", "4", "--checkpoint-dir", str(ckpt),
              "--log-json", str(part), "--no-progress"]  # fmt: skip
    assert main(["train", spec, "--steps", "4", *common]) == 0
    assert main(["train", spec, "--steps", "8", *common]) == 0
    capfd.readouterr()
    resumed = _log(part)
    assert [x["mix"] for x in resumed] == MIXES
    assert _close(lines[-1]["loss"], resumed[-1]["loss"], 1e-6), (lines[-1], resumed[-1])


def test_a_scheduled_spec_needs_its_bundle_and_a_bundle_needs_its_schedule(
    tmp_path, spec_dir, capfd
):
    spec = str(spec_dir / "next" / "tiny_schedule.spindle")
    single, bundle, other = tmp_path / "p.json", tmp_path / "b.json", tmp_path / "o.json"
    plan = ["plan", spec, "--scheduler", "paper", "--quiet", "--jobs", "0", "--out"]
    assert main([*plan[:2], "--mix", "warmup", *plan[2:], str(single)]) == 0
    assert main([*plan, str(bundle)]) == 0
    data = json.loads(bundle.read_text())
    data["phases"][1]["first_step"] = 4
    other.write_text(json.dumps(data))
    capfd.readouterr()
    run = ["--nproc", "4", "--steps", "1"]
    assert main(["train", spec, "--plan", str(single), *run]) == 1
    assert "this spec has a schedule: run it with the plan bundle" in capfd.readouterr().err
    assert main(["train", spec, "--mix", "warmup", "--plan", str(bundle), *run]) == 1
    assert "a plan bundle needs a spec with a schedule" in capfd.readouterr().err
    assert main(["train", spec, "--plan", str(other), *run]) == 1
    err = capfd.readouterr().err
    assert "are not the spec's schedule" in err and "Traceback" not in err
