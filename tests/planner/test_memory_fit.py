"""make_plan's memory fit loop: activation recompute where memory demands it, and why."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from spindle_dsl.cost import make_cost_model
from spindle_dsl.errors import PlanError, PlanFormatError
from spindle_dsl.language import compile_file, compile_text
from spindle_dsl.plan.model import Plan
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner import make_plan
from spindle_dsl.planner.memfit import memory_floor
from spindle_dsl.planner.recompute import candidates, start

MiB = 2**20


@pytest.fixture(scope="module")
def graph(memory_spec):
    return compile_text(memory_spec(768)).graph


def with_memory(graph, mib: int):
    return replace(graph, cluster=graph.cluster.with_overrides(memory_bytes=mib * MiB))


def plan_at(graph, mib: int, **kw):
    g = with_memory(graph, mib)
    return g, make_plan(g, make_cost_model(g.cluster), time_limit_s=0.3, **kw)


def test_a_plan_that_fits_recomputes_nothing(graph) -> None:
    plan = make_plan(graph, make_cost_model(graph.cluster), time_limit_s=0.3)
    assert not any(m.recompute for m in plan.metaops)
    assert not any("recompute" in n for n in plan.notes)
    assert "recompute" not in plan.to_json()


@pytest.mark.parametrize("mib", [300, 150])
def test_tight_memory_turns_recompute_on_and_the_plan_fits(graph, mib) -> None:
    g, plan = plan_at(graph, mib)
    assert validate_plan(plan) == []
    assert max(plan.memory_bytes) <= mib * MiB
    rc = frozenset(m.id for m in plan.metaops if m.recompute)
    assert rc and all(g.op(i).needs_backward for i in rc)
    note = next(n for n in plan.notes if n.startswith("activation recompute on"))
    assert all(f"'{i}'" in note for i in rc) and "per second of extra forward" in note
    # a recomputing MetaOp's curve is its recompute curve (invariant 4 holds on it)
    curves = make_cost_model(g.cluster).curves(g, recompute=rc)
    for m in plan.metaops:
        for n, s in m.seconds_per_layer:
            assert s == curves[m.id].at(n), (m.id, n)


def test_less_memory_recomputes_more(graph) -> None:
    _, roomy = plan_at(graph, 300)
    _, tight = plan_at(graph, 150)
    assert sum(m.recompute for m in roomy.metaops) < sum(m.recompute for m in tight.metaops)


def test_the_floor_picks_the_most_efficient_metaops_first(graph) -> None:
    g = with_memory(graph, 120)  # 16 x 120 MiB is below what the MetaOps keep in all
    cost = make_cost_model(g.cluster)
    floor = memory_floor(g, cost)
    assert floor.total(()) > 16 * 120 * MiB >= floor.total(floor.kept)
    ranked = candidates(g, cost, floor)
    eff = [c.efficiency for c in ranked]
    assert eff == sorted(eff, reverse=True)
    chosen = start(g, cost).ctx.recompute
    prefix = [c.op for c in ranked[: len(chosen)]]
    assert set(prefix) == chosen
    assert floor.total(chosen) <= 16 * 120 * MiB < floor.total(prefix[:-1])


def test_when_even_recompute_cannot_fit_the_error_says_so(graph) -> None:
    g = with_memory(graph, 100)
    with pytest.raises(PlanError) as err:
        make_plan(g, make_cost_model(g.cluster), scheduler="paper")
    text = str(err.value)
    assert "does not fit" in text and "even with activation recompute" in text
    assert "more devices" in text


def test_without_the_memory_check_nothing_recomputes(graph) -> None:
    _, plan = plan_at(graph, 150, check_memory=False, scheduler="paper")
    assert not any(m.recompute for m in plan.metaops)
    assert any(n.startswith("memory check off") for n in plan.notes)


def test_a_shared_module_counts_once_per_device(graph) -> None:
    """Sequential runs every MetaOp on all 16 devices: lm's parts are held once each."""
    cost = make_cost_model(graph.cluster)
    plan = make_plan(graph, cost, scheduler="sequential")
    parts: dict[str, tuple[int, int]] = {}
    kept = working = 0
    for op in graph.metaops:
        sm = cost.slice_memory(graph, op, 16, 0, op.layers)
        parts.update({p.key: (p.replicated, p.sharded) for p in sm.parts})
        kept += sm.kept
        working = max(working, sm.working)
    state = sum(r + s / 16 for r, s in parts.values())
    assert plan.memory_bytes[0] == pytest.approx(state + kept + working, abs=1)
    per_op = sum(cost.slice_memory(graph, op, 16, 0, op.layers).alone(16) for op in graph.metaops)
    assert max(plan.memory_bytes) < per_op - 1  # counting lm once per MetaOp would be more


def test_recompute_round_trips_through_the_plan_file(graph, tmp_path) -> None:
    _, plan = plan_at(graph, 150)
    path = tmp_path / "plan.json"
    plan.write(path)
    data = json.loads(path.read_text())
    flagged = [m["id"] for m in data["metaops"] if "recompute" in m]
    assert flagged and all(m["recompute"] is True for m in data["metaops"] if "recompute" in m)
    back = Plan.read(path)
    assert [m.recompute for m in back.metaops] == [m.recompute for m in plan.metaops]
    data["metaops"][0]["recompute"] = "yes"
    with pytest.raises(PlanFormatError, match="recompute must be true or false"):
        Plan.from_dict(data)


def test_paper_scale_fixtures_fit_with_recompute(shared_dir) -> None:
    spec = shared_dir / "spec"
    for name, devices in [("qwen_val", 32), ("multitask_clip", 8)]:
        g = compile_file(spec / f"{name}.spindle", cluster_overrides={"devices": devices}).graph
        plan = make_plan(g, make_cost_model(g.cluster), time_limit_s=0.3)
        assert validate_plan(plan) == [], name
        assert any(m.recompute for m in plan.metaops), name
