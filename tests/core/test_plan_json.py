"""The plan file round-trips through JSON and bad files give the project's own error."""

import json

import pytest

from spindle_dsl.errors import PlanFormatError
from spindle_dsl.plan import ClusterRef, Entry, Plan, PlanMetaOp, SolverInfo, SpecRef, Wave


def small_plan() -> Plan:
    ops = (
        PlanMetaOp("t/enc", "t", "enc", "vit", 4, 8, 16, (), 1e9, 1000, ((1, 2.0), (2, 1.1))),
        PlanMetaOp(
            "t/lm", "t", "lm", "transformer", 2, 8, 20, ("t/enc",), 2e9, 2000, ((1, 3.0), (2, 1.6))
        ),
    )
    waves = (
        Wave(0, 0.0, 8.0, (Entry("t/enc", 0, 4, (0,), 8.0),)),
        Wave(1, 8.0, 3.2, (Entry("t/lm", 0, 2, (0, 1), 3.2),)),
    )
    return Plan(
        spec=SpecRef("x.spindle", "ab" * 32, None),
        cluster=ClusterRef(2, "cpu", 2, 4 * 2**30),
        metaops=ops,
        waves=waves,
        iteration_s=11.2,
        lower_bound_s=9.0,
        baselines=(("sequential_s", 11.6),),
        solver=SolverInfo("paper", "heuristic", 0.01),
        breakdown=(("compute_s", 11.2),),
        memory_bytes=(100, 50),
        notes=("test",),
        extra={"scheduler_candidates": {"paper": 11.2}},
    )


def test_round_trip(tmp_path):
    plan = small_plan()
    path = tmp_path / "plan.json"
    plan.write(path)
    again = Plan.read(path)
    assert again == plan
    assert again.extra == plan.extra
    data = json.loads(path.read_text())
    assert data["format"] == "spindle-plan" and data["version"] == 2
    assert data["metaops"][1]["seconds_per_layer"] == {"1": 3.0, "2": 1.6}
    assert data["waves"][1]["entries"][0]["layers"] == [0, 2]


@pytest.mark.parametrize(
    "text, words",
    [
        ("{", "invalid JSON"),
        ("[]", "JSON object"),
        ('{"format": "other", "version": 1}', "not a spindle-plan"),
        ('{"format": "spindle-plan", "version": 1}', "malformed plan"),
    ],
)
def test_bad_files_raise_plan_format_error(tmp_path, text, words):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(PlanFormatError, match=words):
        Plan.read(path)


def test_missing_file_is_a_plan_format_error(tmp_path):
    with pytest.raises(PlanFormatError, match="cannot read"):
        Plan.read(tmp_path / "nope.json")


def test_memory_levers_round_trip(tmp_path):
    """``micro_batches`` and ``zero_stage`` are written, read back, and default to 1."""
    from dataclasses import replace

    plan = replace(small_plan(), micro_batches=4, zero_stage=2)
    path = tmp_path / "plan.json"
    plan.write(path)
    data = json.loads(path.read_text())
    assert (data["micro_batches"], data["zero_stage"]) == (4, 2)
    assert Plan.read(path) == plan
    del data["micro_batches"], data["zero_stage"]
    old = Plan.from_dict(data)
    assert (old.micro_batches, old.zero_stage) == (1, 1)


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("micro_batches", 0, "micro_batches must be at least 1"),
        ("micro_batches", "2", "micro_batches must be an integer"),
        ("zero_stage", 3, "zero_stage must be from 0 to 2"),
        ("zero_stage", True, "zero_stage must be an integer"),
        ("loss_devices", [0, 1], "loss_devices must be an object"),
        ("loss_devices", {"a/lm": []}, "must be a non-empty list of devices"),
        ("loss_devices", {"a/lm": [0, -1]}, r"device must be at least 0"),
        ("loss_devices", {"a/lm": [1, 1]}, "repeats a device"),
    ],
)
def test_bad_memory_levers(field, value, words):
    data = small_plan().to_dict()
    data[field] = value
    with pytest.raises(PlanFormatError, match=words):
        Plan.from_dict(data)
