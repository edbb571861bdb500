"""The `milp` scheduler: the paper's plan, improved by MILPs, re-splits and local search.

1. Per MetaLevel, the integer allocation of the whole level is a MILP (``milp.py`` without
   precedence) over a few candidate allocations around the continuous optimum, warm-started
   from the paper's waves for that level, so it can only match or beat them.
2. ``improve``: re-split layers between pieces, ``rebalance`` each wave's allocations, and
   ``backfill`` (MetaOps start in the first wave after their own inputs are done). Five
   more starts get the same treatment: CPA list scheduling across levels (``listsched``),
   task-parallel chains (the ``optimus`` layout), tasks side by side on min-max groups with
   each task's branches side by side (``taskpar``), the levels with their short MetaOps
   in turn on shared devices (``packing``), and the head of the critical chain alone on
   its quickest allocations before the rest task-parallel (``chainstart``); the paper's own
   plan is a seventh, and the ``distmm`` and ``sequential`` layouts (the least memory-hungry,
   which polish can make concurrent where memory allows) come as they are.
3. If the model stays small, one MILP over all waves with precedence constraints, warm-
   started from the best start (never worse than it), adds one more candidate.
4. ``polish``: local search on the placed plan's real iteration time (transfers and
   gradient sync included), when the caller gives that objective, from each of the three
   best distinct candidates (its local optimum depends on where it starts); then
   ``refill``: each wave re-allocated min-max where that makes the placed plan quicker.

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
into a warning and the stages after it go on without a solver. The solver status and gap
of the last MILP that improved the plan are reported.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import replace

from spindle_dsl.planner.allocator import level_optimum
from spindle_dsl.planner.baselines import distmm_schedule, optimus_schedule, sequential_schedule
from spindle_dsl.planner.bounds import level_reference_s
from spindle_dsl.planner.chainstart import chain_head_schedule
from spindle_dsl.planner.crosslevel import improve, rebalance
from spindle_dsl.planner.isolate import SolverCrashWarning, crash_count
from spindle_dsl.planner.listsched import cpa_schedule
from spindle_dsl.planner.milp import MilpResult, SolveStatus, WaveModelSpec, solve_waves
from spindle_dsl.planner.packing import packed_schedule
from spindle_dsl.planner.passes import ALL_PASSES, PassOptions
from spindle_dsl.planner.polish import Objective, polish
from spindle_dsl.planner.problem import OpSpec, Piece, Problem, Schedule, piece_wave_seconds
from spindle_dsl.planner.resplit import resplit
from spindle_dsl.planner.solver import SolverChoice, choose_solver
from spindle_dsl.planner.taskpar import task_parallel_schedule
from spindle_dsl.planner.wavefront import paper_schedule, schedule_level

COMPUTE_SLACK = 1.05  # compute may exceed the level reference by this much (see below)
MAX_BINARIES = 2500  # above this a MILP is skipped: it would not finish in the budget
# Shares of the time limit (set on ``bench/plan_quality.py``'s cases): the level MILPs rarely
# beat the paper's waves and the global MILP rarely beats its start, while the layer re-splits
# of ``improve`` and the polishing of several starts decide the plan; so they get the time.
LEVEL_SHARE = 0.10  # all level MILPs together
IMPROVE_SHARE = 0.13  # each of the five starts' ``improve``
GLOBAL_SHARE = 0.80  # of the time limit, spent when the global MILP must stop
POLISHED = 3  # distinct candidates polished (see ``_polish_best``)
MIN_POLISH_S = 0.02  # a start always gets at least this much polishing
REFINE_S = 0.05  # layer re-split after a polish edit that dissolves a wave
SPREAD = 2  # pareto points kept on each side of the continuous optimum


def candidates(op: OpSpec, n_star: float, devices: int, extra: set[int]) -> tuple[int, ...]:
    """A few allocations for op: pareto points around n*, the smallest one, and ``extra``."""
    pts = [n for n in op.pareto if n <= devices]
    below = [i for i, n in enumerate(pts) if n <= n_star]
    i = below[-1] if below else 0
    keep = set(pts[max(0, i - SPREAD) : i + SPREAD + 2]) | {pts[0]}
    keep |= {n for n in extra if op.valid(n) and n <= devices}
    return tuple(sorted(keep))


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


def _used(waves: tuple[tuple[Piece, ...], ...] | list[tuple[Piece, ...]]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for w in waves:
        for p in w:
            out.setdefault(p.op, set()).add(p.n)
    return out


def _n_star(problem: Problem) -> dict[str, float]:
    """Each op's continuous optimum in its level, over the cores where devices share fewer
    (``Problem.lanes``: no more run at once), around which ``candidates`` are taken."""
    out: dict[str, float] = {}
    for level in problem.levels:
        opt = level_optimum([problem.op(i) for i in level], problem.lanes or problem.devices)
        out.update(opt.n_star)
    return out


def _size(spec_ops: list[OpSpec], cands: list[tuple[int, ...]], waves: int) -> int:
    return sum(len(c) for c in cands) * waves


def level_milp(
    problem: Problem,
    level: tuple[str, ...],
    n_star: dict[str, float],
    time_limit_s: float,
    solver: SolverChoice | None = None,
) -> tuple[list[tuple[Piece, ...]], MilpResult | None]:
    """One level: the paper's waves, or the MILP's if it found shorter ones."""
    ops = [problem.op(i) for i in level]
    paper = schedule_level(ops, problem.devices)
    paper_s = Schedule("paper", tuple(paper)).score(problem)
    used = _used(paper)
    cands = [candidates(o, n_star[o.id], problem.devices, used.get(o.id, set())) for o in ops]
    W = max(len(paper), 1)
    if len(ops) == 1 or _size(ops, cands, W) > MAX_BINARIES or time_limit_s <= 0:
        return paper, None
    ordered = sorted(paper, key=lambda w: -piece_wave_seconds(problem, w))
    # re-number layers so the reordered start still covers each op in order
    start = _renumber(ordered)
    spec = WaveModelSpec(
        tuple(ops), problem.devices, W, tuple(cands), False, start, True, problem.lanes
    )
    res = solve_waves(spec, time_limit_s, solver)
    if res.waves and Schedule("x", res.waves).score(problem) < paper_s * (1 - 1e-9):
        return list(res.waves), res
    return paper, res


def _renumber(waves: list[tuple[Piece, ...]]) -> tuple[tuple[Piece, ...], ...]:
    nxt: dict[str, int] = {}
    out = []
    for w in waves:
        row = []
        for p in w:
            f = nxt.get(p.op, 0)
            row.append(Piece(p.op, f, f + p.layers, p.n))
            nxt[p.op] = f + p.layers
        out.append(tuple(row))
    return tuple(out)


def global_milp(
    problem: Problem,
    start: Schedule,
    n_star: dict[str, float],
    time_limit_s: float,
    solver: SolverChoice | None = None,
) -> MilpResult | None:
    """All waves at once with precedence, warm-started from ``start``; None if too big."""
    used = _used(start.waves)
    cands = [
        candidates(o, n_star[o.id], problem.devices, used.get(o.id, set())) for o in problem.ops
    ]
    W = len(start.waves)
    if _size(list(problem.ops), cands, W) > MAX_BINARIES or time_limit_s <= 0:
        return None
    spec = WaveModelSpec(
        problem.ops, problem.devices, W, tuple(cands), True, start.waves, lanes=problem.lanes
    )
    return solve_waves(spec, time_limit_s, solver)


def milp_schedule(
    problem: Problem,
    time_limit_s: float,
    objective: Objective | None = None,
    solver: SolverChoice | str | None = None,
    passes: PassOptions = ALL_PASSES,
) -> Schedule:
    """Run the stages within about ``time_limit_s`` seconds.

    ``objective`` (memory overflow, iteration time of the placed plan) picks between the
    stages' results and drives ``polish``; without it, ``Schedule.score`` picks and there is
    no polish (for callers that have no cost model). ``solver``: a ``SolverChoice``, a solver
    name, or None for the default (``solver.choose_solver``). A solver process that dies
    costs only its own solve: the plan notes it ("warning: solver failure ...") and the
    ``SolverCrashWarning`` is passed on to the caller. ``passes`` switches stages off, to
    measure what each buys (``passes.PassOptions``).
    """
    choice = solver if isinstance(solver, SolverChoice) else choose_solver(solver)
    cores = on_the_cores(problem) if passes.on_cores else None
    share = time_limit_s / 2 if cores is not None else time_limit_s
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SolverCrashWarning)
        best = _stages(problem, share, objective, choice, passes)
        if cores is not None:  # (module docstring)
            fewer = _stages(cores, share, objective, choice, passes)
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
) -> Schedule:
    """The stages of the module docstring. Once a solve has crashed, the later solver
    stages get no time: a solver that died once is likely to die again, and each restart
    costs its start-up; the heuristics (backfill, rebalance, polish) go on."""
    t0 = time.perf_counter()
    crashes = crash_count()
    cap = _compute_cap(problem)
    key = _ranking(problem, objective, cap)

    def budget(seconds: float) -> float:
        return 0.0 if crash_count() > crashes else seconds

    n_star = _n_star(problem)
    level_budget = LEVEL_SHARE * time_limit_s / max(len(problem.levels), 1)
    waves: list[tuple[Piece, ...]] = []
    results: list[MilpResult] = []
    for level in problem.levels:
        level_s = budget(level_budget) if passes.level_milps else 0.0  # 0: the paper's waves
        lw, res = level_milp(problem, level, n_star, level_s, solver)
        waves.extend(lw)
        if res is not None:
            results.append(res)
    starts = {"levels": Schedule("milp", tuple(waves))}
    if passes.cross_starts:
        starts.update(
            cpa=cpa_schedule(problem),
            tasks=optimus_schedule(problem),
            split=task_parallel_schedule(problem),
        )
        packed = packed_schedule(problem)
        if packed is not None:
            starts["packed"] = packed
        chain = chain_head_schedule(problem)
        if chain is not None:
            starts["chain"] = chain
    each = IMPROVE_SHARE * time_limit_s
    improved = {
        k: replace(improve(problem, s, budget(each), solver, passes), name="milp")
        for k, s in starts.items()
    }
    improved["paper"] = replace(paper_schedule(problem), name="milp")  # never worse than it
    # the layouts that need the least memory, starts polish can improve on when memory
    # binds: tasks in turn with each task's MetaOps side by side, and every MetaOp in turn
    # (polish then merges the short waves the memory allows)
    improved["distmm"] = replace(distmm_schedule(problem), name="milp")
    improved["sequential"] = replace(sequential_schedule(problem), name="milp")
    keys = {k: key(s) for k, s in improved.items()}
    via = min(keys, key=lambda k: keys[k])
    best, best_key = improved[via], keys[via]
    status, gap = _summarise(results)
    notes = [f"level MILPs: {len(results)} solved ({status}); best start: {via}"]
    share = GLOBAL_SHARE if objective is not None else 1.0
    left = share * time_limit_s - (time.perf_counter() - t0)
    glob = global_milp(problem, best, n_star, budget(left), solver) if passes.global_milp else None
    if glob is not None:
        notes.append(
            f"global MILP: {glob.status.value}, {glob.variables} variables, "
            f"gap {glob.gap if glob.gap is not None else 'n/a'}"
        )
        if glob.waves:
            improved["global"] = replace(best, waves=glob.waves)
            keys["global"] = key(improved["global"])
            if keys["global"] < best_key:
                best, best_key = improved["global"], keys["global"]
                notes.append("global MILP improved the plan")
        if glob.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
            status, gap = glob.status.value, glob.gap
    elif not passes.global_milp:
        notes.append("global MILP skipped (switched off)")
    else:
        notes.append("global MILP skipped (model too large, or no time or solver left)")
    if objective is not None and passes.polish:

        def refine(s: Schedule) -> Schedule:
            return resplit(problem, s, budget(REFINE_S) if passes.resplit else 0.0, solver)

        best, via = _polish_best(problem, improved, keys, key, t0 + time_limit_s, cap, refine)
        notes.append(f"polished on placed iteration time; kept the start from {via}")
        if passes.refill:
            best, filled = _rebalance_waves(problem, best, key)
            if filled:
                notes.append(f"re-allocated {filled} wave(s) after polish to use idle devices")
    return replace(best, status=status, gap=gap, notes=tuple(notes))


def _polish_best(
    problem: Problem,
    cands: dict[str, Schedule],
    keys: dict[str, tuple[float, ...]],
    objective: Objective,
    deadline: float,
    compute_cap: float,
    refine: Callable[[Schedule], Schedule],
) -> tuple[Schedule, str]:
    """Polish the ``POLISHED`` best distinct candidates and keep the best result.

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
        left = deadline - time.perf_counter()
        share = max(left / (len(order) - i), MIN_POLISH_S)
        polished = polish(problem, cands[k], objective, share, compute_cap, refine)
        pk = objective(polished)
        if pk < best_key:
            best, best_key, best_k = polished, pk, k
    return best, best_k


def _rebalance_waves(
    problem: Problem, sched: Schedule, objective: Objective
) -> tuple[Schedule, int]:
    """Polish's edits (merges, absorbed pieces, copied allocations) can end on waves whose
    pieces leave devices idle while the wave's slowest piece could have run faster on them.
    ``rebalance`` re-picks each wave's allocations min-max; each wave's new allocation is
    kept only if the placed plan gets better by ``objective`` (its transfers may not allow
    it). Returns the schedule and how many waves changed."""
    full = rebalance(problem, sched)
    best, best_key, changed = sched, objective(sched), 0
    for wi, wave in enumerate(full.waves):
        if wave == best.waves[wi]:
            continue
        trial = replace(best, waves=(*best.waves[:wi], wave, *best.waves[wi + 1 :]))
        trial_key = objective(trial)
        if trial_key < best_key:
            best, best_key, changed = trial, trial_key, changed + 1
    return best, changed


def _summarise(results: list[MilpResult]) -> tuple[str, float | None]:
    """Status of a list of MILPs: optimal only if all were; the worst gap."""
    if not results:
        return "heuristic", None
    if all(r.status is SolveStatus.OPTIMAL for r in results):
        return "optimal", 0.0
    gaps = [r.gap for r in results if r.gap is not None]
    ok = any(r.status is SolveStatus.FEASIBLE for r in results)
    return ("feasible" if ok else "heuristic"), (max(gaps) if gaps else None)
