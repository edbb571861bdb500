"""Planning with a measured profile: the lever search prices a few MetaOps at a time (a
sub-graph), and a profiled curve may read its inputs' MetaOps, so pricing by parts must give
the curves pricing the whole graph gives, and a whole plan must come out."""

from __future__ import annotations

from pathlib import Path

import pytest

from spindle_dsl.cost.profile import ProfiledCostModel
from spindle_dsl.cost.profiler import TimingBudget, profile_graph
from spindle_dsl.language import compile_file
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner import make_plan
from spindle_dsl.planner.model.levers import Levers, PricingCache, pass_curves

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny_mm.spindle"
QUICK = TimingBudget(warmup=0, min_repeats=1, max_repeats=1, min_seconds=0.0)


@pytest.fixture(scope="module")
def profiled():
    graph = compile_file(str(TINY), cluster_overrides={"devices": 2}).graph
    return graph, ProfiledCostModel(graph.cluster, profile_graph(graph, points=2, budget=QUICK))


def test_pricing_some_metaops_gives_the_curves_of_pricing_all(profiled) -> None:
    graph, cost = profiled
    late = frozenset(op.id for op in graph.metaops if op.id.endswith("/lm"))
    levers = Levers(2, 1, late)
    cache = PricingCache(graph)
    pass_curves(graph, cost, Levers(2, 1), cache)  # everything priced without recompute
    by_parts = pass_curves(graph, cost, levers, cache)  # then only the recomputing ones
    whole = pass_curves(graph, cost, levers, PricingCache(graph))
    assert [c.seconds for c in by_parts] == [c.seconds for c in whole]


@pytest.mark.parametrize("scheduler", ["default", "sequential"])
def test_a_profiled_plan_comes_out_whole(profiled, scheduler) -> None:
    graph, cost = profiled
    plan = make_plan(graph, cost, scheduler=scheduler, time_limit_s=0.5)
    assert validate_plan(plan) == []
    assert plan.lower_bound_s <= plan.iteration_s


@pytest.mark.parametrize("margin", [0.0, 10.0])
def test_default_keeps_the_data_parallel_plan_unless_the_gain_beats_the_margin(
    profiled, margin, monkeypatch
) -> None:
    """Under a margin no plan can beat, the default scheduler runs the sequential plan (the
    layout plain DDP runs) and says why; with none it keeps the quickest plan."""
    graph, cost = profiled
    monkeypatch.setattr(cost, "prediction_margin", margin)
    plan = make_plan(graph, cost, scheduler="default", time_limit_s=0.5)
    sequential = plan.baseline("sequential_s")
    kept = [n for n in plan.notes if n.startswith("kept the sequential (data-parallel) plan")]
    quickest = min(plan.extra["candidates_s"].values())
    if margin:
        assert plan.iteration_s == pytest.approx(sequential, rel=1e-12)
        assert len(kept) == 1
        assert quickest < sequential  # the case is one where another plan is predicted faster
    else:
        assert not kept
        assert plan.iteration_s == pytest.approx(quickest)
