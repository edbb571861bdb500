"""make_plan end to end on synthetic MetaGraphs: valid plans, placement, memory, timing."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth import SynthCost, make_graph, random_graph

from spindle_dsl.errors import PlanError
from spindle_dsl.plan.model import Plan
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner import SCHEDULERS, make_plan

TWO_TASKS = {
    "caption": [[("vision", 12, 40.0), ("proj", 1, 1.0), ("lm", 8, 80.0)]],
    "speech": [[("audio", 6, 20.0), ("lm", 8, 80.0)]],
}


@pytest.fixture(scope="module")
def graph():
    return make_graph(TWO_TASKS, devices=16, per_node=8)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_every_scheduler_gives_a_valid_plan(graph, scheduler):
    plan = make_plan(graph, SynthCost(graph.cluster), scheduler=scheduler, time_limit_s=0.3)
    assert validate_plan(plan) == []
    assert plan.solver.name == (scheduler if scheduler != "default" else plan.solver.name)
    assert set(dict(plan.baselines)) == {"sequential_s", "distmm_s", "optimus_s"}
    assert len(plan.memory_bytes) == 16


def test_default_is_never_slower_than_paper_or_a_baseline(graph):
    plan = make_plan(graph, SynthCost(graph.cluster), time_limit_s=0.5)
    cands = plan.extra["candidates_s"]
    assert plan.iteration_s == pytest.approx(min(cands.values()))
    for secs in dict(plan.baselines).values():
        assert plan.iteration_s <= secs * (1 + 1e-9)
    assert plan.lower_bound_s <= plan.iteration_s


def test_json_round_trip_stays_valid(graph, tmp_path):
    plan = make_plan(graph, SynthCost(graph.cluster), scheduler="paper")
    path = tmp_path / "plan.json"
    plan.write(path)
    again = Plan.read(path)
    assert validate_plan(again) == []
    assert again.waves == plan.waves
    assert again.extra["scheduler"] == "paper"


def test_iteration_counts_transfers_and_grad_sync(graph):
    plan = make_plan(graph, SynthCost(graph.cluster), scheduler="paper")
    parts = dict(plan.breakdown)
    assert parts["compute_s"] == pytest.approx(sum(w.duration_s for w in plan.waves))
    assert plan.iteration_s == pytest.approx(sum(parts.values()))
    assert parts["transfer_s"] > 0  # speech/audio continues on other devices in wave 1


def test_placement_keeps_groups_in_a_node_and_continuations_in_place(graph):
    plan = make_plan(graph, SynthCost(graph.cluster), scheduler="paper")
    per_node = plan.cluster.devices_per_node
    last: dict[str, tuple[int, ...]] = {}
    for w in plan.waves:
        for e in w.entries:
            if len(e.devices) <= per_node:
                assert len({d // per_node for d in e.devices}) == 1, e
            prev = last.get(e.metaop)
            if prev is not None and len(prev) == len(e.devices):
                assert prev == e.devices, e
            last[e.metaop] = e.devices


def test_sequential_keeps_everything_on_all_devices(graph):
    plan = make_plan(graph, SynthCost(graph.cluster), scheduler="sequential")
    assert all(len(w.entries) == 1 and len(w.entries[0].devices) == 16 for w in plan.waves)
    assert dict(plan.breakdown)["transfer_s"] == 0


def test_memory_overflow_names_the_metaops_and_what_to_change(graph):
    # sequential keeps every layer on all 16 devices (~580 MB each); spread out they fit
    small = replace(graph, cluster=graph.cluster.with_overrides(memory_bytes=400_000_000))
    with pytest.raises(PlanError) as err:
        make_plan(small, SynthCost(small.cluster), scheduler="sequential")
    text = str(err.value)
    assert "does not fit: device" in text and "GiB" in text
    assert any(f"'{m.id}'" in text for m in graph.metaops)
    assert "more devices" in text and "batch" in text
    # the default scheduler spreads the layers instead, and then it fits
    plan = make_plan(small, SynthCost(small.cluster), time_limit_s=0.3)
    assert validate_plan(plan) == []
    assert max(plan.memory_bytes) <= 400_000_000


def test_a_workload_bigger_than_the_whole_cluster_says_so(graph):
    tiny = replace(graph, cluster=graph.cluster.with_overrides(memory_bytes=20_000_000))
    with pytest.raises(PlanError, match=r"need at least .* in all .* devices of this kind"):
        make_plan(tiny, SynthCost(tiny.cluster))


def test_memory_check_off_returns_the_plan_with_a_note(graph):
    tiny = replace(graph, cluster=graph.cluster.with_overrides(memory_bytes=20_000_000))
    plan = make_plan(tiny, SynthCost(tiny.cluster), scheduler="paper", check_memory=False)
    assert any(n.startswith("memory check off") for n in plan.notes)
    assert any("memory" in e for e in validate_plan(plan))


def test_a_layer_too_big_for_any_device_is_a_plan_error(graph):
    tiny = replace(graph, cluster=graph.cluster.with_overrides(memory_bytes=1000))
    with pytest.raises(PlanError, match="one of its layers needs"):
        make_plan(tiny, SynthCost(tiny.cluster))


def test_unknown_scheduler_is_a_plan_error(graph):
    with pytest.raises(PlanError, match="unknown scheduler"):
        make_plan(graph, SynthCost(graph.cluster), scheduler="magic")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 100_000), st.sampled_from([1, 4, 8, 16, 24]), st.integers(1, 4))
def test_random_graphs_plan_validly(seed, devices, tasks):
    g = random_graph(random.Random(seed), devices, tasks)
    plan = make_plan(g, SynthCost(g.cluster), time_limit_s=0.2)
    assert validate_plan(plan) == []
    assert plan.iteration_s <= dict(plan.baselines)["sequential_s"] * (1 + 1e-9)
