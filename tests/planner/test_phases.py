"""Planning every phase of a schedule: one plan per distinct graph, side by side or here."""

from __future__ import annotations

from pathlib import Path

import pytest

from spindle_dsl.errors import PlanError
from spindle_dsl.language import compile_file, compile_text
from spindle_dsl.plan.bundle import validate_bundle
from spindle_dsl.planner.search.phases import distinct_graphs, plan_schedule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = (EXAMPLES / "tiny_schedule.spindle").read_text()


def test_every_phase_is_planned_for_its_own_graph():
    schedule = compile_file(EXAMPLES / "tiny_schedule.spindle").schedule
    bundle = plan_schedule(schedule, scheduler="paper", jobs=0)
    assert validate_bundle(bundle) == []
    assert [(p.first_step, p.mix) for p in bundle.phases] == [
        (0, "warmup"),
        (3, "caption_only"),
        (6, "balanced"),
    ]
    assert {m.task for m in bundle.phases[1].plan.metaops} == {"caption"}
    batches = [{m.task: m.batch for m in p.plan.metaops} for p in bundle.phases]
    assert batches == [
        {"caption": 24, "transcribe": 8},
        {"caption": 32},
        {"caption": 24, "transcribe": 24},
    ]
    assert bundle.planning["plans"] == 3 and bundle.planning["worker_processes"] == 0


def test_worker_processes_plan_the_same_phases():
    schedule = compile_file(EXAMPLES / "tiny_schedule.spindle").schedule
    here = plan_schedule(schedule, scheduler="paper", jobs=0)
    there = plan_schedule(schedule, scheduler="paper", jobs=2)
    assert there.planning["worker_processes"] == 2
    for a, b in zip(here.phases, there.phases, strict=True):
        assert a.plan.waves == b.plan.waves and a.plan.metaops == b.plan.metaops


def test_equal_graphs_share_a_plan():
    text = TINY.replace("  6: balanced", "  6: warmup\n  8: same").replace(
        "mix balanced", "mix same { global_batch = 32; caption = 6; transcribe = 2 }\nmix balanced"
    )
    schedule = compile_text(text).schedule
    graphs, index = distinct_graphs(schedule)
    assert len(graphs) == 2 and index == [0, 1, 0, 0]
    bundle = plan_schedule(schedule, scheduler="paper", jobs=0)
    assert bundle.planning == {**bundle.planning, "plans": 2, "phases_sharing_a_plan": 2}
    assert [p.plan.spec.mix for p in bundle.phases] == ["warmup", "caption_only", "warmup", "same"]
    assert bundle.phases[3].plan.waves == bundle.phases[0].plan.waves
    assert validate_bundle(bundle) == []


def test_a_phase_that_cannot_be_planned_is_named():
    schedule = compile_text(TINY, cluster_overrides={"memory_bytes": 2**20}).schedule
    with pytest.raises(PlanError, match="phase from step 0 \\(mix 'warmup'\\)"):
        plan_schedule(schedule, scheduler="paper", jobs=0)


def test_by_default_helpers_start_only_for_spare_cores(monkeypatch):
    from spindle_dsl.planner.search import helpers

    schedule = compile_file(EXAMPLES / "tiny_schedule.spindle").schedule
    monkeypatch.setattr(helpers, "spare_cores", lambda: 0)
    assert plan_schedule(schedule, scheduler="paper").planning["worker_processes"] == 0
    monkeypatch.setattr(helpers, "spare_cores", lambda: 1)
    assert plan_schedule(schedule, scheduler="paper").planning["worker_processes"] == 1


def test_a_phase_whose_kinds_a_helper_cannot_import_is_planned_here(monkeypatch):
    from spindle_dsl.planner.search import phases

    monkeypatch.setattr(phases, "kind_modules", lambda graph: None)
    schedule = compile_file(EXAMPLES / "tiny_schedule.spindle").schedule
    bundle = plan_schedule(schedule, scheduler="paper", jobs=2)
    assert bundle.planning["worker_processes"] == 0 and validate_bundle(bundle) == []
