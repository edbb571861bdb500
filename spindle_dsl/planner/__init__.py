"""The wave planner: from a MetaGraph and a cost model to a placed, timed wave plan.

``make_plan(graph, cost, scheduler=...)`` is the stage function. Schedulers:

* ``paper``: Spindle's algorithm as published (per-MetaLevel continuous optimum, bi-point
  discretisation, greedy wavefront), see ``wavefront``;
* ``milp``: the paper's plan improved by python-mip (level MILPs, cross-level backfilling,
  a global MILP with precedence when small enough), see ``milp_scheduler``;
* ``default``: ``milp``, ``paper`` and the baselines all placed and timed with transfers and
  gradient sync, keeping the fastest that fits in memory (the plan says which won);
* ``sequential``, ``distmm``, ``optimus``: the baselines, as plans of their own.

Memory: with a cost model that prices memory per parameter part (both built-in models), a plan
that does not fit turns on activation recompute for the MetaOps that free the most memory per
second of extra compute, and plans again (``recompute``); the plan marks them and says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from spindle_dsl.cost.base import CostModel, has_slice_memory
from spindle_dsl.errors import PlanError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan
from spindle_dsl.planner import recompute
from spindle_dsl.planner.baselines import BASELINES
from spindle_dsl.planner.bounds import level_reference_s
from spindle_dsl.planner.build import Evaluated, PlanContext, context, evaluate, to_plan
from spindle_dsl.planner.isolate import warm_up
from spindle_dsl.planner.lp_bound import lp_bound as lp_relaxation_bound
from spindle_dsl.planner.memfit import overflow_message
from spindle_dsl.planner.milp_scheduler import milp_schedule
from spindle_dsl.planner.passes import ALL_PASSES, PassOptions
from spindle_dsl.planner.problem import Schedule
from spindle_dsl.planner.solver import SolverChoice, choose_solver
from spindle_dsl.planner.wavefront import paper_schedule

SCHEDULERS: tuple[str, ...] = ("default", "milp", "paper", *BASELINES)
DEFAULT_TIME_LIMIT_S = 1.5


def _key(ev: Evaluated, ctx: PlanContext, check_memory: bool) -> tuple[float, float]:
    """Memory overflow first (when it is checked), then iteration time."""
    return ev.key(ctx.topology.capacity) if check_memory else (0.0, ev.iteration_s)


def _schedules(
    ctx: PlanContext,
    scheduler: str,
    time_limit_s: float,
    check_memory: bool,
    evaluate: Callable[[Schedule], Evaluated],
    solver: SolverChoice | None = None,
    passes: PassOptions = ALL_PASSES,
) -> dict[str, Schedule]:
    out: dict[str, Schedule] = {}
    if scheduler in ("default", "milp"):

        def objective(s: Schedule) -> tuple[float, float]:
            return _key(evaluate(s), ctx, check_memory)

        out["milp"] = milp_schedule(ctx.problem, time_limit_s, objective, solver, passes)
    if scheduler in ("default", "paper"):
        out["paper"] = paper_schedule(ctx.problem)
    for name, fn in BASELINES.items():
        out[name] = fn(ctx.problem)
    return out


def _cached(ctx: PlanContext) -> Callable[[Schedule], Evaluated]:
    """Placement and timing depend only on the waves: evaluate each schedule once (per
    context, so the fit loop's last round and the final one share their evaluations)."""
    memo: dict[tuple, Evaluated] = ctx.evaluated

    def cached(s: Schedule) -> Evaluated:
        if s.waves not in memo:
            memo[s.waves] = evaluate(ctx, s)
        ev = memo[s.waves]
        return ev if ev.schedule is s else replace(ev, schedule=s)

    return cached


def _plan_round(
    ctx: PlanContext,
    scheduler: str,
    time_limit_s: float,
    check_memory: bool,
    solver: SolverChoice | None = None,
    passes: PassOptions = ALL_PASSES,
) -> tuple[dict[str, Evaluated], Evaluated]:
    """Every candidate schedule evaluated, and the one ``scheduler`` picks."""
    cached = _cached(ctx)
    schedules = _schedules(ctx, scheduler, time_limit_s, check_memory, cached, solver, passes)
    evaluated = {k: cached(s) for k, s in schedules.items()}
    if scheduler == "default":
        chosen = min(evaluated.values(), key=lambda e: _key(e, ctx, check_memory))
    else:
        chosen = evaluated[scheduler]
    return evaluated, chosen


def _quick(scheduler: str) -> Callable[[PlanContext], list[Evaluated]]:
    """What the fit loop judges a recompute choice by: the schedules ``scheduler`` would
    consider, less the MILP (the paper's plan stands in for it; the final round runs it)."""

    def judge(ctx: PlanContext) -> list[Evaluated]:
        cached = _cached(ctx)
        if scheduler in BASELINES:
            return [cached(BASELINES[scheduler](ctx.problem))]
        paper = cached(paper_schedule(ctx.problem))
        if scheduler != "default":
            return [paper]
        return [paper, *(cached(fn(ctx.problem)) for fn in BASELINES.values())]

    return judge


def make_plan(
    graph: MetaGraph,
    cost: CostModel,
    *,
    scheduler: str = "default",
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    check_memory: bool = True,
    solver: str | None = None,
    passes: PassOptions = ALL_PASSES,
) -> Plan:
    """Plan one training iteration of ``graph`` (see the module docstring for schedulers).

    ``time_limit_s`` bounds the ``milp`` scheduler's solver and search time (the whole call
    also prices curves, runs the baselines and places every candidate). Raises
    ``PlanError`` for an unknown scheduler or when the plan does not fit in device memory
    even with activation recompute wherever it helps.
    ``check_memory=False`` returns the plan anyway, without recompute, with notes saying
    where it does not fit (``validate_plan`` still reports the overflow): for comparing
    schedules under a cost model whose memory figures are known to be pessimistic.
    ``solver``: the MILP solver, "highs" or "cbc" (default: ``$SPINDLE_SOLVER``, else HiGHS;
    see ``planner.solver``). ``passes``: the ``milp`` scheduler's passes to run (all by
    default; ``bench/plan_quality.py --ablation`` switches each off in turn).
    ``lower_bound_s`` is the LP bound (``lp_bound``, proven below every plan of these
    curves); ``extra["bounds"]`` holds it (``lp_s``, None if the LP failed) beside the
    area / critical-path bound (``area_path_s``) and the LP's solving time (``lp_wall_s``).
    """
    if scheduler not in SCHEDULERS:
        raise PlanError(f"unknown scheduler '{scheduler}' (choose from {', '.join(SCHEDULERS)})")
    choice = choose_solver(solver)
    if choice.isolated:
        warm_up()  # the LP bound's solver process starts while the curves are priced
    t0 = time.perf_counter()
    state: recompute.FitState | None = None
    if check_memory and has_slice_memory(cost):
        state = recompute.fit(graph, cost, _quick(scheduler))
        ctx = state.ctx
    else:
        ctx = context(graph, cost)
    evaluated, chosen = _plan_round(ctx, scheduler, time_limit_s, check_memory, choice, passes)
    while state is not None and not chosen.fits:  # the MILP's pick may still overflow
        nxt = state.step(chosen)
        if nxt is None:
            break
        state, ctx = nxt, nxt.ctx
        evaluated, chosen = _plan_round(ctx, scheduler, time_limit_s, check_memory, choice, passes)
    if not chosen.fits and check_memory:
        names = [c.op for c in state.candidates] if state and state.ctx.recompute else ()
        raise PlanError(overflow_message(ctx, chosen, names))
    baselines = {k: evaluated[k].iteration_s for k in BASELINES}
    notes = _notes(scheduler, chosen, evaluated)
    note = state.note() if state else None
    if note:
        notes += (note,)
    if not chosen.fits:
        notes += ("memory check off: " + overflow_message(ctx, chosen),)
    # the bound for the curves this plan was made with; with micro-batches (issue 10) pass
    # the plan's k here, and see ``lp_bound`` for a bound over every k the planner may pick
    bound = lp_relaxation_bound(ctx.problem, micro_batches=1, solver=choice)
    if bound.note:
        notes += (bound.note,)
    extra = {
        "scheduler": scheduler,
        "candidates_s": {k: e.iteration_s for k, e in evaluated.items()},
        "level_reference_s": level_reference_s(ctx.problem),
        "solver_notes": list(chosen.schedule.notes),
        "bounds": {
            "lp_s": bound.seconds,
            "area_path_s": bound.area_path_s,
            "lp_wall_s": bound.wall_s,
        },
    }
    return to_plan(
        ctx,
        chosen,
        lower_bound_s=bound.lower_bound_s,
        baselines=baselines,
        wall_s=time.perf_counter() - t0,
        notes=notes,
        extra=extra,
    )


def _notes(scheduler: str, chosen: Evaluated, evaluated: dict[str, Evaluated]) -> tuple[str, ...]:
    notes = []
    name = chosen.schedule.name
    if scheduler == "default":
        others = ", ".join(
            f"{k} {e.iteration_s:.4g} s{'' if e.fits else ' (does not fit in memory)'}"
            for k, e in evaluated.items()
            if k != name
        )
        notes.append(f"default scheduler kept '{name}' ({chosen.iteration_s:.4g} s); {others}")
    seq = evaluated["sequential"]
    if chosen.iteration_s > seq.iteration_s:
        notes.append(
            f"iteration_s exceeds sequential_s: the '{name}' plan was asked for explicitly"
            if scheduler != "default"
            else "iteration_s exceeds sequential_s: the sequential plan does not fit in memory"
        )
    return tuple(notes)


__all__ = ["DEFAULT_TIME_LIMIT_S", "SCHEDULERS", "make_plan"]
