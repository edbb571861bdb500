"""One planning round: every candidate schedule of one lever setting, placed and timed, and
the one the scheduler picks.

``make_plan`` runs a round at the lever search's best setting and one at each runner-up
setting (``search.make.RUNNER_UP_MARGIN``). A round reads only its context, so a round can also be
described by a picklable ``RoundRequest`` (the graph, the cost model, the levers and the
options) and run in another process (``remote_round``, which ``planner.search.helpers`` sends
to a helper process): the context it rebuilds there is the one the lever search built here, the
search's caches being only memos.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

from spindle_dsl.cost.base import CostModel
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.planner.evaluate.build import Evaluated, PlanContext, context, evaluate_cached
from spindle_dsl.planner.evaluate.lossspread import spread_round
from spindle_dsl.planner.model.levers import Levers
from spindle_dsl.planner.model.passes import ALL_PASSES, PassOptions
from spindle_dsl.planner.model.problem import Schedule
from spindle_dsl.planner.search.helpers import Caught
from spindle_dsl.planner.search.milp_scheduler import milp_schedule
from spindle_dsl.planner.solver.choice import SolverChoice
from spindle_dsl.planner.starts.baselines import BASELINES
from spindle_dsl.planner.starts.wavefront import paper_schedule


def round_key(ev: Evaluated, ctx: PlanContext, check_memory: bool) -> tuple[float, float]:
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
            return round_key(evaluate(s), ctx, check_memory)

        out["milp"] = milp_schedule(ctx.problem, time_limit_s, objective, solver, passes)
    if scheduler in ("default", "paper"):
        out["paper"] = paper_schedule(ctx.problem)
    for name, fn in BASELINES.items():
        out[name] = fn(ctx.problem)
    return out


Round = tuple[dict[str, Evaluated], Evaluated]


def plan_round(
    ctx: PlanContext,
    scheduler: str,
    time_limit_s: float,
    check_memory: bool,
    solver: SolverChoice | None = None,
    passes: PassOptions = ALL_PASSES,
) -> Round:
    """Every candidate schedule evaluated, and the one ``scheduler`` picks."""

    def cached(s: Schedule) -> Evaluated:
        return evaluate_cached(ctx, s)

    schedules = _schedules(ctx, scheduler, time_limit_s, check_memory, cached, solver, passes)
    # the pick is spread whatever it could gain, and the baselines too where the plan reports
    # this round's (without the lever search; with it, their own tuned plans, spread there)
    reported = not (check_memory and ctx.per_part)
    always = {scheduler, *(BASELINES if reported else ())}
    evaluated = spread_round(
        ctx, {k: cached(s) for k, s in schedules.items()}, always, passes.match_cuts
    )
    if scheduler == "default":
        chosen = min(evaluated.values(), key=lambda e: round_key(e, ctx, check_memory))
    else:
        chosen = evaluated[scheduler]
    return evaluated, chosen


@dataclass(frozen=True)
class RoundRequest:
    """A round at ``levers`` as another process runs it (picklable). ``kind_modules``: the
    modules that register the graph's layer kinds, imported there first. ``placed``: plans
    the lever search already placed and timed under these levers (the paper's and the
    baselines'), which the round would otherwise place again (a good part of a rival round
    at 64 devices; each is the same there, the context being the same)."""

    graph: MetaGraph
    cost: CostModel
    levers: Levers
    scheduler: str
    time_limit_s: float
    check_memory: bool
    solver: SolverChoice
    passes: PassOptions = ALL_PASSES
    kind_modules: tuple[str, ...] = ()
    placed: tuple[Evaluated, ...] = ()


HELPER = "a planning helper"  # where a remote round solves (``SolverChoice.host``)


def remote_round(request: RoundRequest) -> tuple[Round, Caught] | None:
    """``plan_round`` of ``request`` in the context the lever search builds for its levers,
    with the warnings it raised, for the caller to raise; None where a module registering the
    graph's kinds does not import here (the caller plans the round itself). Meant for a helper
    process: its solves run in it, not in a solver process of its own (a crash ends the
    helper, and the caller plans the round itself), which saves starting one per helper."""
    r = request
    try:
        for module in r.kind_modules:
            importlib.import_module(module)
    except ImportError:  # (registered by a module only the caller's own import system finds)
        return None
    ctx = context(r.graph, r.cost, r.levers, enforce=True)
    for ev in r.placed:
        ctx.evaluated.setdefault(ev.schedule.waves, ev)
    # this process is the isolation: a solver crash here ends it, and the caller re-plans
    solver = replace(r.solver, isolated=False, host=HELPER) if r.solver.isolated else r.solver
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = plan_round(ctx, r.scheduler, r.time_limit_s, r.check_memory, solver, r.passes)
    return out, tuple((w.category, str(w.message)) for w in caught)
