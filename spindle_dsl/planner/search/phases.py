"""Plan every phase of a schedule: one plan per distinct MetaGraph, several at once.

Where the time goes (measured with ``bench/schedule_bench.py``): curves and planning contexts
cost milliseconds, the MILP and the placement of candidates cost the rest (most of a phase's
planning time, bounded by the time limit). So sharing curves between phases buys nothing
worth its complexity, while two things do pay:

* phases whose graphs are equal (the same mix twice, or two mixes that give every task the
  same batch) are planned once and share the plan;
* distinct graphs are planned side by side: this process plans the first while the planner's
  helper processes (``planner.search.helpers``, one per core the load leaves idle, or
  ``jobs``) plan the others, each with a solver process of its own, so a solver crash in one
  phase is a warning there, as in a single plan. A helper that dies costs its phase, which
  is planned here.

With one distinct graph, or ``jobs=0``, everything runs in this process. The plans made side
by side start no helpers of their own for their runner-up rounds: the phases fill the cores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from spindle_dsl.errors import PlanError, SpindleError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.phases import MixSchedule
from spindle_dsl.plan.bundle import BundlePhase, PlanBundle
from spindle_dsl.plan.model import Plan, SpecRef
from spindle_dsl.planner.search.helpers import (
    Caught,
    answer,
    helper_count,
    kind_modules,
    side_by_side,
)
from spindle_dsl.planner.search.helpers import start as start_helpers
from spindle_dsl.planner.search.make import DEFAULT_TIME_LIMIT_S, make_plan

if TYPE_CHECKING:
    from spindle_dsl.cost.profile import Profile


@dataclass(frozen=True)
class PlanRequest:
    """What planning one graph needs (picklable: it travels to a helper process)."""

    graph: MetaGraph
    # a `spindle profile` file or a loaded profile (the profile cache's), else the analytic model
    profile: str | Profile | None = None
    scheduler: str = "default"
    time_limit_s: float | None = None  # None: the planner's default
    check_memory: bool = True
    solver: str | None = None
    micro_batches: int | None = None  # force the lever (None: the planner chooses)
    zero_stage: int | None = None
    # helper processes for its runner-up rounds (``planner.search.helpers``; None: its default)
    helpers: int | None = None
    tp: int | None = None  # force this tensor-parallel degree (``--tp``; None: the model chooses)
    kind_modules: tuple[str, ...] = ()  # modules registering the graph's kinds, for a helper


def plan_one(request: PlanRequest) -> Plan:
    """``make_plan`` for one graph, with the cost model the request names."""
    from spindle_dsl.cost import make_cost_model

    r = request
    return make_plan(
        r.graph,
        make_cost_model(r.graph.cluster, profile=r.profile, tp=r.tp),
        scheduler=r.scheduler,
        time_limit_s=DEFAULT_TIME_LIMIT_S if r.time_limit_s is None else r.time_limit_s,
        check_memory=r.check_memory,
        solver=r.solver,
        micro_batches=r.micro_batches,
        zero_stage=r.zero_stage,
        jobs=r.helpers,
    )


def _problem(graph: MetaGraph) -> MetaGraph:
    """The graph without what the planner never reads: its mix's name and task weights."""
    return replace(graph, mix=None, tasks=tuple(replace(t, weight=None) for t in graph.tasks))


def distinct_graphs(schedule: MixSchedule) -> tuple[list[MetaGraph], list[int]]:
    """The graphs to plan, and for each phase the index of its graph among them (graphs that
    differ only in their mix's name and weights, not in any batch, are the same problem)."""
    graphs: list[MetaGraph] = []
    index: list[int] = []
    for p in schedule.phases:
        bare = _problem(p.graph)
        found = next((i for i, g in enumerate(graphs) if _problem(g) == bare), None)
        if found is None:
            graphs.append(p.graph)
            found = len(graphs) - 1
        index.append(found)
    return graphs, index


def plan_schedule(
    schedule: MixSchedule,
    *,
    profile: str | Profile | None = None,
    scheduler: str = "default",
    time_limit_s: float | None = None,
    check_memory: bool = True,
    solver: str | None = None,
    jobs: int | None = None,
    micro_batches: int | None = None,
    zero_stage: int | None = None,
    tp: int | None = None,
) -> PlanBundle:
    """A plan per phase of ``schedule``, as a bundle. ``jobs``: helper processes planning
    beside this one (default: one per distinct graph but the first, at most one per spare
    core, ``helpers.spare_cores``; 0 plans everything here). ``micro_batches``/``zero_stage``
    force that lever in every phase (``make_plan``), ``tp`` that tensor-parallel degree
    (``make_cost_model``). Raises ``PlanError`` naming the phase
    that cannot be planned."""
    t0 = time.perf_counter()
    graphs, index = distinct_graphs(schedule)
    kinds = _kinds(graphs)
    workers = min(helper_count(jobs, len(graphs) - 1), len(graphs) - 1) if kinds is not None else 0
    # phases side by side already fill the cores, and ``jobs=0`` asks for one process
    helpers = 0 if workers or jobs == 0 else None
    requests = [
        PlanRequest(
            g,
            profile,
            scheduler,
            time_limit_s,
            check_memory,
            solver,
            micro_batches,
            zero_stage,
            helpers,
            tp,
            kinds or (),
        )
        for g in graphs
    ]
    outcomes = _side_by_side(requests, workers)
    phases = []
    for p, i in zip(schedule.phases, index, strict=True):
        outcome = outcomes[i]
        if isinstance(outcome, str):
            raise PlanError(f"phase from step {p.first_step} (mix '{p.mix}'): {outcome}")
        plan = outcome if outcome.spec.mix == p.mix else _for_mix(outcome, p.mix)
        phases.append(BundlePhase(p.first_step, p.mix, plan))
    first = schedule.phases[0].graph
    return PlanBundle(
        SpecRef(first.spec_path, first.spec_sha256, None),
        tuple(phases),
        {
            "wall_s": time.perf_counter() - t0,
            "worker_processes": workers,
            "plans": len(graphs),
            "phases_sharing_a_plan": len(schedule) - len(graphs),
        },
    )


def _kinds(graphs: list[MetaGraph]) -> tuple[str, ...] | None:
    """The modules a helper imports to rebuild every graph's kinds (None: one cannot)."""
    found: set[str] = set()
    for g in graphs:
        modules = kind_modules(g)
        if modules is None:
            return None
        found.update(modules)
    return tuple(sorted(found))


def _for_mix(plan: Plan, mix: str) -> Plan:
    return replace(plan, spec=replace(plan.spec, mix=mix))


def _here(request: PlanRequest) -> Plan | str:
    """One request planned in this process: its plan, or the message of its error."""
    try:
        return plan_one(request)
    except SpindleError as exc:
        return exc.render()


def remote_plan(request: PlanRequest) -> tuple[Plan | str, Caught] | None:
    """``_here`` in a helper process, with the warnings it raised, for the caller to raise;
    None where a module registering the graph's kinds does not import there."""
    return answer(request.kind_modules, lambda: _here(request))


def _side_by_side(requests: list[PlanRequest], workers: int) -> list[Plan | str]:
    """The first request planned here while ``workers`` helpers plan the others."""
    limit = max(r.time_limit_s or DEFAULT_TIME_LIMIT_S for r in requests)
    first, rest = side_by_side(
        lambda: _here(requests[0]),
        requests[1:],
        lambda i: _here(requests[i + 1]),
        start_helpers(workers) if workers else (),
        remote_plan,
        limit,
    )
    return [first, *rest]
