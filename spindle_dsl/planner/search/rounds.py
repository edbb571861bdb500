"""One planning round: every candidate schedule of one lever setting, placed and timed, and
the one the scheduler picks; and the ``milp`` scheduler's stages (``milp_schedule``).

``make_plan`` runs a round at the lever search's best setting and one at each runner-up
setting (``search.make.RUNNER_UP_MARGIN``). A round reads only its context, so a round can also be
described by a picklable ``RoundRequest`` (the graph, the cost model, the levers and the
options) and run in another process (``remote_round``, which ``planner.search.helpers`` sends
to a helper process): the context it rebuilds there is the one the lever search built here, the
search's caches being only memos.

The `milp` scheduler: the paper's plan, improved by layer re-splits and local search.

1. Starts: the MetaLevels' waves as the paper cuts them, one level after another, and five
   layouts that ignore the level boundaries: CPA list scheduling across levels
   (``crosslevel.cpa_schedule``), task-parallel chains (the ``optimus`` layout), tasks side by
   side on min-max groups with each task's branches side by side (``crosslevel``), the levels
   with their short MetaOps in turn on shared devices (``wavefront.packed_schedule``), and the
   head of the critical chain alone on its quickest allocations before the rest task-parallel
   (``crosslevel.chain_head_schedule``).
2. ``improve`` each start: re-split layers between its pieces (an LP/MILP through
   ``solver``), ``rebalance`` each wave's allocations min-max, re-split again. The paper's
   own plan joins as it is, and so do the ``distmm`` and ``sequential`` layouts (the least
   memory-hungry, which polish can make concurrent where memory allows). The levels' waves
   go first, then the others best compute first, each placed once improved; where steps are
   slow (1,024 devices and more) those left when the call's budget would run out are not
   made or not improved (``_improve_starts``).
3. If the model stays small, one MILP over all waves with precedence (``wave_milp``),
   warm-started from the best candidate (never worse than it), adds one more.
4. ``polish``: local search on the placed plan's real iteration time (transfers and
   gradient sync included), when the caller gives that objective, from each of the three
   best distinct candidates (its local optimum depends on where it starts).

Where CPU workers share fewer cores (``Problem.lanes``), the stages run twice, at half the
time each: on every worker, and on as many workers as cores (``on_the_cores``), the others
idle; the better placed plan is kept. The fewer workers take no turns on the cores and reduce
gradients over smaller groups, which only the placed plan prices: over 2 cores, the plan on 2
of tiny_mm's 4 workers is quicker than the plan on all 4 (with a profile of a 2-core machine
and with the analytic model alike), and so is wide_adapters' on 2 of 8; where the plan on
every worker wins (cpu_medium on 4), half the time costs it next to nothing.

Candidates are ranked by memory overflow, then by whether their compute exceeds
``COMPUTE_SLACK`` x the sum of MetaLevel continuous optima (the planner's quality bar: polish
may trade compute for less communication, but not past that), then by iteration time.
Solves run through ``solver`` (HiGHS or CBC, isolated in a worker process); a crash turns
into a warning and the stages after it go on without a solver. The solver status and gap of
the global MILP are reported.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from spindle_dsl.cost.base import CostModel
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.planner.bound.floors import level_reference_s
from spindle_dsl.planner.evaluate.build import (
    Evaluated,
    PlanContext,
    compute_floor,
    context,
    evaluate_cached,
)
from spindle_dsl.planner.evaluate.relabel import spread_round
from spindle_dsl.planner.improve.polish import Objective, improve, polish
from spindle_dsl.planner.improve.resplit import resplit
from spindle_dsl.planner.improve.wave_milp import SolveStatus, global_milp, level_optima
from spindle_dsl.planner.model.levers import ALL_PASSES, Levers, PassOptions
from spindle_dsl.planner.model.problem import Problem, Schedule
from spindle_dsl.planner.search.helpers import Caught, answer, solving_here
from spindle_dsl.planner.solver.choice import SolverChoice, choose_solver
from spindle_dsl.planner.solver.isolate import SolverCrashWarning, crash_count
from spindle_dsl.planner.starts.baselines import (
    BASELINES,
    distmm_schedule,
    optimus_schedule,
    sequential_schedule,
)
from spindle_dsl.planner.starts.crosslevel import (
    chain_head_schedule,
    cpa_schedule,
    task_parallel_schedule,
)
from spindle_dsl.planner.starts.wavefront import packed_schedule, paper_schedule


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
    deadline: float = math.inf,
) -> dict[str, Schedule]:
    out: dict[str, Schedule] = {}
    if scheduler in ("default", "milp"):

        def objective(s: Schedule) -> tuple[float, float]:
            return round_key(evaluate(s), ctx, check_memory)

        out["milp"] = milp_schedule(
            ctx.problem, time_limit_s, objective, solver, passes, deadline=deadline
        )
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
    deadline: float = math.inf,
    known: Mapping[str, float] | None = None,
) -> Round:
    """Every candidate schedule evaluated, and the one ``scheduler`` picks. ``deadline``
    (``time.perf_counter``): when the planning call's budget ends (``milp_schedule``).
    ``known``: the quickest fitting iteration of each baseline at the settings already
    searched, where the plan reports each baseline at its best setting (the lever search's);
    a baseline whose compute here (``compute_floor``) is no quicker is left out of the
    round: it could be neither the pick nor what the plan reports for it (at 1,024 H100s x
    48 tasks, placing optimus takes a second)."""

    def cached(s: Schedule) -> Evaluated:
        return evaluate_cached(ctx, s)

    schedules = _schedules(
        ctx, scheduler, time_limit_s, check_memory, cached, solver, passes, deadline
    )
    # the pick is spread whatever it could gain, and the baselines too where the plan reports
    # this round's (without the lever search; with it, their own tuned plans, spread there)
    reported = not (check_memory and ctx.per_part)
    always = {scheduler, *(BASELINES if reported else ())}
    beaten = () if reported else _beaten(ctx, schedules, known or {}, scheduler)
    placed = {k: cached(s) for k, s in schedules.items() if k not in beaten}
    evaluated = spread_round(ctx, placed, always, passes.match_cuts, deadline)
    if scheduler == "default":
        chosen = min(evaluated.values(), key=lambda e: round_key(e, ctx, check_memory))
    else:
        chosen = evaluated[scheduler]
    return evaluated, chosen


def _beaten(
    ctx: PlanContext, schedules: Mapping[str, Schedule], known: Mapping[str, float], keep: str
) -> frozenset[str]:
    """The baselines among ``schedules``, other than ``keep``, not yet placed, whose compute
    floor is no quicker than their ``known`` time (``plan_round``)."""
    return frozenset(
        name
        for name, s in schedules.items()
        if name in known
        and name != keep
        and s.waves not in ctx.evaluated
        and compute_floor(ctx, s) >= known[name]
    )


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


def remote_round(request: RoundRequest) -> tuple[Round, Caught] | None:
    """``plan_round`` of ``request`` in the context the lever search builds for its levers,
    with the warnings it raised, for the caller to raise; None where a module registering the
    graph's kinds does not import here (the caller plans the round itself). Meant for a helper
    process: its solves run in it, not in a solver process of its own (a crash ends the
    helper, and the caller plans the round itself), which saves starting one per helper."""
    r = request

    def work() -> Round:
        ctx = context(r.graph, r.cost, r.levers, enforce=True)
        for ev in r.placed:
            ctx.evaluated.setdefault(ev.schedule.waves, ev)
        solver = solving_here(r.solver)
        return plan_round(ctx, r.scheduler, r.time_limit_s, r.check_memory, solver, r.passes)

    return answer(r.kind_modules, work)


COMPUTE_SLACK = 1.05  # compute may exceed the level reference by this much (see below)
# Shares of the time limit: the layer re-splits of ``improve`` and the polishing of several
# starts decide the plan, so they get the time; what the starts' ``improve`` leaves goes to
# polish.
IMPROVE_SHARE = 0.13  # each of the six starts' ``improve``
GLOBAL_SHARE = 0.80  # of the time limit, spent when the global MILP must stop
POLISHED = 3  # distinct candidates polished (see ``_polish_best``)
# Placements the round makes after its starts' (the baselines, polish, the renamings), and
# after polish (the baselines, the renamings), in units of its slowest placement so far: what
# the starts' improvement, and polish past its own time, leave time for before the deadline
TAIL_STEPS = 8
AFTER_POLISH_STEPS = 4
# ... once they are this slow: quicker steps run whatever the clock says (at 64 devices a start
# costs 5-15 ms, and leaving some out to keep a 0.4 s budget gave the widget plans that
# overflowed; at 1,024 devices x 48 tasks a start costs 0.3-0.5 s)
SLOW_STEP_S = 0.05
MIN_POLISH_S = 0.02  # a start gets at least this much polishing, while the deadline allows
REFINE_S = 0.05  # layer re-split after a polish edit that dissolves a wave


def on_the_cores(problem: Problem) -> Problem | None:
    """Where the devices share fewer cores, the same ops on as many devices as cores, each
    with its allocations up to that: any schedule of it is one of ``problem`` that leaves the
    other devices idle. None where every device has a core, or where an op needs more."""
    lanes = problem.lanes
    if lanes is None:
        return None
    ops = []
    for o in problem.ops:
        keep = [(n, t) for n, t in zip(o.ns, o.seconds, strict=True) if n <= lanes]
        if not keep:
            return None
        ops.append(replace(o, ns=tuple(n for n, _ in keep), seconds=tuple(t for _, t in keep)))
    return Problem(tuple(ops), lanes)


def milp_schedule(
    problem: Problem,
    time_limit_s: float,
    objective: Objective | None = None,
    solver: SolverChoice | str | None = None,
    passes: PassOptions = ALL_PASSES,
    deadline: float = math.inf,
) -> Schedule:
    """Run the stages within about ``time_limit_s`` seconds.

    ``objective`` (memory overflow, iteration time of the placed plan) picks between the
    stages' results and drives ``polish``; without it, ``Schedule.score`` picks and there is
    no polish (for callers that have no cost model). ``solver``: a ``SolverChoice``, a solver
    name, or None for the default (``solver.choose_solver``). A solver process that dies
    costs only its own solve: the plan notes it ("warning: solver failure ...") and the
    ``SolverCrashWarning`` is passed on to the caller. ``passes`` switches stages off, to
    measure what each buys (``levers.PassOptions``). ``deadline`` (``time.perf_counter``):
    when the whole planning call must be done; the starts are improved best first while the
    time left allows (``_improve_starts``).
    """
    choice = solver if isinstance(solver, SolverChoice) else choose_solver(solver)
    cores = on_the_cores(problem) if passes.on_cores else None
    share = time_limit_s / 2 if cores is not None else time_limit_s
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SolverCrashWarning)
        best = _stages(problem, share, objective, choice, passes, deadline)
        if cores is not None:  # (module docstring)
            fewer = _stages(cores, share, objective, choice, passes, deadline)
            key = _ranking(problem, objective, _compute_cap(problem))
            if key(fewer) < key(best):
                said = f"planned on {cores.devices} of the {problem.devices} workers"
                best = replace(fewer, notes=(*fewer.notes, f"{said}, as many as the cores"))
    crashes = []
    for w in caught:
        if issubclass(w.category, SolverCrashWarning):
            crashes.append(f"warning: {w.message}")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    notes = (f"solver: {choice.label}", *choice.notes, *best.notes, *crashes)
    return replace(best, notes=notes)


def _compute_cap(problem: Problem) -> float:
    """The most compute a candidate may have before it ranks below every one within it."""
    return COMPUTE_SLACK * level_reference_s(problem)


def _ranking(
    problem: Problem, objective: Objective | None, cap: float
) -> Callable[[Schedule], tuple[float, float, float]]:
    """How candidates of ``problem`` rank: memory overflow, then whether compute exceeds
    ``cap``, then time (module docstring)."""

    def key(s: Schedule) -> tuple[float, float, float]:
        over, secs = objective(s) if objective is not None else (0.0, s.score(problem))
        return (over, float(s.compute_s(problem) > cap * (1 + 1e-9)), secs)

    return key


def _stages(
    problem: Problem,
    time_limit_s: float,
    objective: Objective | None,
    solver: SolverChoice,
    passes: PassOptions = ALL_PASSES,
    deadline: float = math.inf,
) -> Schedule:
    """The stages of the module docstring. Once a solve has crashed, the later re-splits get
    no time: a solver that died once is likely to die again, and each restart costs its
    start-up; the heuristics (rebalance, polish) go on."""
    t0 = time.perf_counter()
    crashes = crash_count()
    cap = _compute_cap(problem)
    key = _ranking(problem, objective, cap)

    def budget(seconds: float) -> float:
        return 0.0 if crash_count() > crashes else seconds

    each = IMPROVE_SHARE * time_limit_s

    def improve_one(s: Schedule) -> Schedule:
        return replace(improve(problem, s, budget(each), solver, passes), name="milp")

    pace = _Pace(deadline)
    makers = _other_starts(passes)
    improved, placed, skipped = _improve_starts(problem, makers, improve_one, key, pace)
    improved["paper"] = replace(paper_schedule(problem), name="milp")  # never worse than it
    improved["distmm"] = replace(distmm_schedule(problem), name="milp")
    improved["sequential"] = replace(sequential_schedule(problem), name="milp")
    keys = {k: placed[k] if k in placed else key(s) for k, s in improved.items()}
    via = min(keys, key=lambda k: keys[k])
    best = improved[via]
    notes = [f"best start: {via}"]
    if skipped:
        notes.append(f"time budget: {', '.join(skipped)} not improved")
    status, gap = "heuristic", None
    if passes.global_milp:
        share = GLOBAL_SHARE if objective is not None else 1.0
        left = budget(share * time_limit_s - (time.perf_counter() - t0))
        glob = global_milp(problem, best, level_optima(problem), left, solver)
        if glob is None:
            notes.append("global MILP skipped (model too large, or no time or solver left)")
        else:
            notes.append(
                f"global MILP: {glob.status.value}, {glob.variables} variables, "
                f"gap {glob.gap if glob.gap is not None else 'n/a'}"
            )
            if glob.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
                status, gap = glob.status.value, glob.gap
            if glob.waves:
                improved["global"] = replace(best, waves=glob.waves)
                keys["global"] = key(improved["global"])
                if keys["global"] < keys[via]:
                    via, best = "global", improved["global"]
                    notes.append("global MILP improved the plan")
    if objective is not None and passes.polish:

        def refine(s: Schedule) -> Schedule:
            return resplit(problem, s, budget(REFINE_S) if passes.resplit else 0.0, solver)

        best, via = _polish_best(problem, improved, keys, key, t0 + time_limit_s, pace, cap, refine)
        notes.append(f"polished on placed iteration time; kept the start from {via}")
    return replace(best, status=status, gap=gap, notes=tuple(notes))


@dataclass
class _Pace:
    """When the planning call must be done, and the round's slowest placement so far: what
    prices the placements still to come."""

    deadline: float
    placing: float = 0.0
    per_piece: float = 0.0  # the slowest placement's seconds per piece placed

    def placed(self, seconds: float, schedule: Schedule) -> None:
        """Record one placement of ``schedule`` that took ``seconds``."""
        self.placing = max(self.placing, seconds)
        self.per_piece = max(self.per_piece, seconds / max(1, _pieces(schedule)))

    def placing_s(self, schedule: Schedule) -> float:
        """What placing ``schedule`` would take, at the slowest pace per piece so far: a
        plan of the paper's waves at 1,024 H100s x 48 tasks has four times the pieces of the
        MILP's, and takes four times as long to place."""
        return self.per_piece * _pieces(schedule)

    def allows(self, now: float, step_s: float, steps_after: int) -> bool:
        """Whether a step of ``step_s`` seconds, then ``steps_after`` placements, would end
        before the deadline, or the steps are too quick to matter (``SLOW_STEP_S``)."""
        if max(step_s, self.placing) < SLOW_STEP_S:
            return True
        return now + step_s + steps_after * self.placing <= self.deadline


def _pieces(schedule: Schedule) -> int:
    return sum(len(w) for w in schedule.waves)


def _improve_starts(
    problem: Problem,
    makers: dict[str, Callable[[Problem], Schedule | None]],
    improve_one: Callable[[Schedule], Schedule],
    key: Callable[[Schedule], tuple[float, ...]],
    pace: _Pace,
) -> tuple[dict[str, Schedule], dict[str, tuple[float, ...]], list[str]]:
    """Each start improved and ranked (placed), and the names of those left out. The levels'
    waves go first; the other starts (``makers``) are made only if one more improvement would
    still end before the deadline (at the pace of the slowest so far, then ``TAIL_STEPS`` of
    the slowest placement), and improved best compute first while that holds. At 1,024
    devices a start costs half a second to improve and up to as much to make; on the
    reference specs the deadline is never near."""
    improved: dict[str, Schedule] = {}
    keys: dict[str, tuple[float, ...]] = {}
    slowest = 0.0

    def one(name: str, start: Schedule) -> None:
        nonlocal slowest
        t = time.perf_counter()
        improved[name] = improve_one(start)
        placed_at = time.perf_counter()
        keys[name] = key(improved[name])
        pace.placed(time.perf_counter() - placed_at, improved[name])
        slowest = max(slowest, time.perf_counter() - t)

    one("levels", replace(paper_schedule(problem), name="milp"))
    made: dict[str, Schedule] | None = None
    if pace.allows(time.perf_counter(), slowest, TAIL_STEPS):
        made = {k: s for k, make in makers.items() if (s := make(problem)) is not None}
    for name in sorted(made or {}, key=lambda k: made[k].score(problem)):
        if not pace.allows(time.perf_counter(), slowest, TAIL_STEPS):
            break
        one(name, made[name])
    left = [k for k in (makers if made is None else made) if k not in improved]
    in_order = {k: improved[k] for k in ("levels", *makers) if k in improved}
    return in_order, keys, left


def _other_starts(passes: PassOptions) -> dict[str, Callable[[Problem], Schedule | None]]:
    """How to make the starts besides the levels' waves (module docstring, step 1): None
    where one does not apply."""
    if not passes.cross_starts:
        return {}
    return {
        "cpa": cpa_schedule,
        "tasks": optimus_schedule,
        "split": task_parallel_schedule,
        "packed": packed_schedule,
        "chain": chain_head_schedule,
    }


def _polish_best(
    problem: Problem,
    cands: dict[str, Schedule],
    keys: dict[str, tuple[float, ...]],
    objective: Objective,
    end: float,
    pace: _Pace,
    compute_cap: float,
    refine: Callable[[Schedule], Schedule],
) -> tuple[Schedule, str]:
    """Polish the ``POLISHED`` best distinct candidates and keep the best result, within
    ``end`` (the round's time), each for at least ``MIN_POLISH_S``, where one move of it (a
    placement, at the pace per piece so far) and what follows polish (``AFTER_POLISH_STEPS``)
    would end before the call's deadline.

    Polish is a local search on the placed plan's real objective, and its local optimum
    depends on where it starts: the best start on estimated compute is often not the one
    that ends best once transfers and gradient sync are counted (a plan whose shared
    layers sit in one node, say). Each start gets an equal share of the time left, what one
    does not use passes to the next.
    """
    order: list[str] = []
    seen: set[tuple] = set()
    for k in sorted(keys, key=lambda k: keys[k]):
        if cands[k].waves not in seen:
            seen.add(cands[k].waves)
            order.append(k)
    order = order[:POLISHED]
    best_k = order[0]
    best, best_key = cands[best_k], keys[best_k]
    for i, k in enumerate(order):
        now = time.perf_counter()
        if not pace.allows(now, pace.placing_s(cands[k]), AFTER_POLISH_STEPS):
            continue  # (not even one move of it would end in time)
        share = max((end - now) / (len(order) - i), MIN_POLISH_S)
        polished = polish(problem, cands[k], objective, share, compute_cap, refine)
        pk = objective(polished)
        if pk < best_key:
            best, best_key, best_k = polished, pk, k
    return best, best_k
