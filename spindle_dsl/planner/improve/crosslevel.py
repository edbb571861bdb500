"""Improving a schedule's waves: each wave's allocations re-picked min-max (``rebalance``),
between two re-splits of layers across the waves (``resplit``), in ``improve``; after polish,
each wave re-picked so only where the placed plan gets quicker (``refill``).
"""

from __future__ import annotations

from dataclasses import replace

from spindle_dsl.planner.improve.polish import Objective
from spindle_dsl.planner.improve.resplit import resplit
from spindle_dsl.planner.model.passes import ALL_PASSES, PassOptions
from spindle_dsl.planner.model.problem import (
    OpSpec,
    Piece,
    Problem,
    Schedule,
    piece_wave_seconds,
    wave_seconds,
)
from spindle_dsl.planner.solver.choice import SolverChoice
from spindle_dsl.planner.solver.isolate import crash_count
from spindle_dsl.planner.starts.minmax import min_max


def rebalance(problem: Problem, sched: Schedule) -> Schedule:
    """Re-pick each wave's allocations to shorten it, keeping its pieces' layers.

    For fixed layer counts, each wave gets the min-max allocation of its pieces (``minmax``:
    the least time within which every piece, on its least allocation ending it so, fits; the
    devices left over go to the piece that ends last, while it can speed up). A wave is
    changed only if the time it saves beats the allocation changes it adds (each one moves
    an op's activations, ``OpSpec.switch_s``).
    """
    prev_n: dict[tuple[int, str], int] = {}  # n of the op's piece before / after wave w
    next_n: dict[tuple[int, str], int] = {}
    last: dict[str, int] = {}
    for wi, wave in enumerate(sched.waves):
        for p in wave:
            if p.op in last:
                prev_n[wi, p.op] = last[p.op]
            last[p.op] = p.n
    last = {}
    for wi in reversed(range(len(sched.waves))):
        for p in sched.waves[wi]:
            if p.op in last:
                next_n[wi, p.op] = last[p.op]
            last[p.op] = p.n

    def switches(wi: int, op: str, n: int) -> float:
        count = (prev_n.get((wi, op), n) != n) + (next_n.get((wi, op), n) != n)
        return count * problem.op(op).switch_s

    out = []
    for wi, wave in enumerate(sched.waves):
        ops = {p.op: problem.op(p.op) for p in wave}
        k = {p.op: p.layers for p in wave}
        least = min_max(list(ops.values()), problem.devices, k)
        if least is None:  # the pieces do not fit side by side at their least allocations
            out.append(wave)
            continue
        alloc = least
        # pieces the new allocation does not slow past the new duration keep their n
        new = _lasts(ops, k, alloc, problem.lanes)
        # pieces alike on cores of their own: the wave is its slowest piece
        alike = len({o.backward_share for o in ops.values()}) <= 1 and problem.lanes is None
        for p in wave:
            room = problem.devices - sum(alloc.values()) + alloc[p.op]
            if p.n == alloc[p.op] or p.n > room:
                continue
            if alike:  # the wave is its slowest piece: a piece within it keeps it
                keeps = k[p.op] * ops[p.op].t(p.n) <= new
            else:
                keeps = _lasts(ops, k, {**alloc, p.op: p.n}, problem.lanes) <= new
            if keeps:
                alloc[p.op] = p.n
        old = piece_wave_seconds(problem, wave)
        added = sum(switches(wi, p.op, alloc[p.op]) - switches(wi, p.op, p.n) for p in wave)
        shorter = new < old * (1 - 1e-9) and new + added < old * (1 - 1e-9)
        if sum(alloc.values()) <= problem.devices and shorter:
            out.append(tuple(Piece(p.op, p.first, p.end, alloc[p.op]) for p in wave))
        else:
            out.append(wave)
    return Schedule(sched.name, tuple(out), sched.status, sched.gap, sched.notes)


def refill(problem: Problem, sched: Schedule, objective: Objective) -> tuple[Schedule, int]:
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


def improve(
    problem: Problem,
    sched: Schedule,
    time_limit_s: float = 0.1,
    solver: SolverChoice | None = None,
    passes: PassOptions = ALL_PASSES,
) -> Schedule:
    """Re-split layers, rebalance the waves, re-split again (not if the first re-split's
    solver crashed: see ``isolate.crash_count``). ``passes`` may switch the re-splits off."""
    half = time_limit_s / 2 if passes.resplit else 0.0  # resplit with no time: unchanged
    crashes = crash_count()
    s = rebalance(problem, resplit(problem, sched, half, solver))
    second = half if crash_count() == crashes else 0.0
    return resplit(problem, s, second, solver)


def _lasts(
    ops: dict[str, OpSpec], layers: dict[str, int], alloc: dict[str, int], lanes: int | None
) -> float:
    """How long a wave of these ops' pieces (``layers`` each, on ``alloc``) lasts."""
    return wave_seconds(((ops[i], layers[i] * ops[i].t(alloc[i]), alloc[i]) for i in alloc), lanes)
