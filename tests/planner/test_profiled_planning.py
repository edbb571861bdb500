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
from spindle_dsl.planner.levers import Levers, PricingCache, pass_curves

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
