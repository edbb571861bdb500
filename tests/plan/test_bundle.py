"""The plan bundle: JSON round trip, telling bundles from plans, and its invariants."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from spindle_dsl.errors import PlanFormatError
from spindle_dsl.language import compile_file
from spindle_dsl.plan.bundle import PlanBundle, read_plan_file, validate_bundle
from spindle_dsl.plan.model import ClusterRef, Plan
from spindle_dsl.planner.search.phases import plan_schedule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def bundle() -> PlanBundle:
    schedule = compile_file(EXAMPLES / "tiny_schedule.spindle").schedule
    return plan_schedule(schedule, scheduler="paper", jobs=0)


def test_json_round_trip_and_file_kind(tmp_path, bundle):
    assert validate_bundle(bundle) == []
    path = tmp_path / "bundle.json"
    bundle.write(path)
    back = read_plan_file(path)
    assert isinstance(back, PlanBundle) and back == bundle
    assert back.planning["plans"] == 3
    one = tmp_path / "plan.json"
    bundle.phases[1].plan.write(one)
    assert isinstance(read_plan_file(one), Plan)
    # every phase's plan is a plan-format plan on its own
    raw = json.loads(path.read_text())
    assert [Plan.from_dict(p["plan"]).spec.mix for p in raw["phases"]] == [
        "warmup",
        "caption_only",
        "balanced",
    ]
    assert bundle.phase_at(0).mix == "warmup" and bundle.phase_at(5).mix == "caption_only"


def test_each_broken_invariant_is_named(bundle):
    p0, p1, p2 = bundle.phases
    bad = replace(bundle, phases=(replace(p0, first_step=1), p1, replace(p2, first_step=3)))
    errs = validate_bundle(bad)
    assert "phases: the first phase must start at step 0, not 1" in errs
    assert "phases: first_step 3 does not come after 3" in errs
    other = replace(
        p1.plan, cluster=ClusterRef(8, "cpu", 8, 1), spec=replace(p1.plan.spec, mix="x")
    )
    errs = validate_bundle(replace(bundle, phases=(p0, replace(p1, plan=other), p2)))
    assert any("phase 2 (caption_only, from step 3): the plan is for mix 'x'" in e for e in errs)
    assert any("one run keeps its devices" in e for e in errs)
    broken = replace(p2.plan, iteration_s=1e-12)
    errs = validate_bundle(replace(bundle, phases=(p0, p1, replace(p2, plan=broken))))
    assert errs and all(e.startswith("phase 3 (balanced, from step 6): ") for e in errs)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"format": "spindle-plan-bundle", "version": 2}, "version 1"),
        ({"format": "spindle-plan-bundle", "version": 1, "phases": []}, "non-empty"),
        (
            {"format": "spindle-plan-bundle", "version": 1, "spec": {"path": "", "sha256": ""},
             "phases": [{"first_step": "0", "mix": "m", "plan": {}}]},
            "first_step must be an integer",
        ),
        (
            {"format": "spindle-plan-bundle", "version": 1, "spec": {"path": "", "sha256": ""},
             "phases": [{"first_step": 0, "mix": "m", "plan": {"format": "x"}}]},
            "phase 1 (m): not a spindle-plan",
        ),
    ],
)  # fmt: skip
def test_malformed_bundles_are_format_errors(tmp_path, data, words):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanFormatError, match=words.replace("(", r"\(").replace(")", r"\)")):
        read_plan_file(path)
