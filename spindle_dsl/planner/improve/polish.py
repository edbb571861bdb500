"""Local search on the real objective (placement, transfers and gradient sync included), and
each wave's allocations re-picked min-max (``rebalance``).

The schedulers optimise compute time with only an estimate of what moving activations
costs, and a tail of short waves can cost more in transfers at their boundaries than it
saves in compute. ``polish`` therefore tries small edits of a schedule and keeps one only
if the placed, timed plan gets better (first memory overflow, then iteration time):

* align a wave: every piece of it takes its predecessor's allocation at once (its MetaOp's
  previous piece's, or a starting MetaOp's producer's), so placement can keep every input
  where it is: a wave of small pieces (a task's heads, after their encoders) whose
  allocations were balanced for compute otherwise moves all its inputs for little gain;
  where those allocations together need more devices than there are, the pieces whose
  inputs cost most to move keep theirs, or the wave splits into consecutive waves that
  each hold theirs (``_split_align``);
* dissolve a wave: each of its pieces joins its MetaOp's piece in the previous (or next)
  wave, keeping that piece's allocation, and the layers are then re-split between the
  pieces (``refine``): one edit that removes a short wave and the transfers at its edges,
  which single-piece edits cannot do when every piece alone would lengthen the plan;
* merge two neighbouring waves (re-allocating the merged wave if it needs more devices);
* absorb a piece into the previous or next piece of the same MetaOp (fewer cuts);
* give a piece the allocation of the MetaOp's previous piece, or of its producer's last
  piece, so that placement can keep the activations where they are.

Edits are tried shortest waves and smallest pieces first, until none helps or time is up.

Improving a schedule's waves: each wave's allocations re-picked min-max (``rebalance``),
between two re-splits of layers across the waves (``resplit``), in ``improve``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from itertools import pairwise

from spindle_dsl.planner.improve.resplit import resplit
from spindle_dsl.planner.model.levers import ALL_PASSES, PassOptions
from spindle_dsl.planner.model.problem import (
    OpSpec,
    Piece,
    Problem,
    Schedule,
    piece_wave_seconds,
    schedule_errors,
    wave_seconds,
)
from spindle_dsl.planner.solver.choice import SolverChoice
from spindle_dsl.planner.solver.isolate import crash_count
from spindle_dsl.planner.starts.layout import min_max

Objective = Callable[[Schedule], tuple[float, ...]]


def _min_max_alloc(problem: Problem, wave: list[Piece]) -> list[Piece] | None:
    """Fit ``wave`` on the devices with the shortest duration (None if it cannot fit)."""
    layers = {p.op: p.layers for p in wave}
    alloc = min_max([problem.op(p.op) for p in wave], problem.devices, layers)
    if alloc is None:
        return None
    return [Piece(p.op, p.first, p.end, alloc[p.op]) for p in wave]


def _merges(problem: Problem, waves: list[tuple[Piece, ...]]) -> Iterator[list[tuple[Piece, ...]]]:
    order = sorted(
        range(len(waves) - 1),
        key=lambda k: min(_dur(problem, waves[k]), _dur(problem, waves[k + 1])),
    )
    for k in order:
        a, b = waves[k], waves[k + 1]
        if {p.op for p in a} & {p.op for p in b}:
            continue
        merged = [*a, *b]
        if sum(p.n for p in merged) > problem.devices:
            fitted = _min_max_alloc(problem, merged)
            if fitted is None:
                continue
            merged = fitted
        yield [*waves[:k], tuple(merged), *waves[k + 2 :]]


def _dissolves(
    problem: Problem, waves: list[tuple[Piece, ...]]
) -> Iterator[list[tuple[Piece, ...]]]:
    """Each wave (shortest first) folded into its previous, then its next, neighbour."""
    for k in sorted(range(len(waves)), key=lambda k: _dur(problem, waves[k])):
        for target in (k - 1, k + 1):
            if not 0 <= target < len(waves):
                continue
            into = {p.op: p for p in waves[target]}
            if any(p.op not in into for p in waves[k]):
                continue  # a piece with nowhere to go: not this neighbour
            for p in waves[k]:
                q = into[p.op]
                into[p.op] = Piece(p.op, min(p.first, q.first), max(p.end, q.end), q.n)
            out = list(waves)
            out[target] = tuple(into[q.op] for q in waves[target])
            del out[k]
            yield out


def _dur(problem: Problem, wave: tuple[Piece, ...]) -> float:
    return piece_wave_seconds(problem, wave)


def _pieces(waves: list[tuple[Piece, ...]]) -> dict[str, list[tuple[int, int]]]:
    """Each op's pieces as (wave index, position in the wave), in layer order."""
    out: dict[str, list[tuple[int, int]]] = {}
    for wi, w in enumerate(waves):
        for j, p in enumerate(w):
            out.setdefault(p.op, []).append((wi, j))
    return out


def _replace(waves, edits: dict[tuple[int, int], Piece | None]) -> list[tuple[Piece, ...]]:
    out = []
    for wi, w in enumerate(waves):
        row = []
        for j, p in enumerate(w):
            q = edits.get((wi, j), p)
            if q is not None:
                row.append(q)
        if row:
            out.append(tuple(row))
    return out


def _absorbs(problem: Problem, waves: list[tuple[Piece, ...]]) -> Iterator[list[tuple[Piece, ...]]]:
    where = _pieces(waves)
    pairs = []
    for locs in where.values():
        for (w1, j1), (w2, j2) in pairwise(locs):
            pairs.append(((w1, j1), (w2, j2)))
    pairs.sort(
        key=lambda pr: min(waves[pr[0][0]][pr[0][1]].layers, waves[pr[1][0]][pr[1][1]].layers)
    )
    for (w1, j1), (w2, j2) in pairs:
        p1, p2 = waves[w1][j1], waves[w2][j2]
        yield _replace(waves, {(w1, j1): Piece(p1.op, p1.first, p2.end, p1.n), (w2, j2): None})
        yield _replace(waves, {(w1, j1): None, (w2, j2): Piece(p2.op, p1.first, p2.end, p2.n)})


def _aligns(problem: Problem, waves: list[tuple[Piece, ...]]) -> Iterator[list[tuple[Piece, ...]]]:
    where = _pieces(waves)
    last_n: dict[str, int] = {}
    for wi, w in enumerate(waves):
        used = sum(p.n for p in w)
        for j, p in enumerate(w):
            targets = []
            if p.op in last_n:
                targets.append(last_n[p.op])
            else:
                targets.extend(last_n[d] for d in problem.op(p.op).deps if d in last_n)
            locs = where[p.op]
            k = locs.index((wi, j))
            if k + 1 < len(locs):
                nw, nj = locs[k + 1]
                targets.append(waves[nw][nj].n)
            for n in dict.fromkeys(targets):
                if n != p.n and problem.op(p.op).valid(n) and used - p.n + n <= problem.devices:
                    yield _replace(waves, {(wi, j): Piece(p.op, p.first, p.end, n)})
        for p in w:
            last_n[p.op] = p.n


def _predecessors(
    problem: Problem, waves: list[tuple[Piece, ...]]
) -> list[tuple[dict[str, tuple[int, bool]], dict[str, tuple[int, str]]]]:
    """Per wave, each piece's predecessor: its MetaOp's previous piece, else (a MetaOp
    starting) its widest producer's last. Two maps: the allocation the piece would keep its
    activations in place with and whether its MetaOp continues; and where that predecessor
    ran, (its wave's index, its MetaOp)."""
    last: dict[str, tuple[int, int]] = {}  # op -> (wave index, n) of its latest piece
    out = []
    for wi, w in enumerate(waves):
        want: dict[str, tuple[int, bool]] = {}
        source: dict[str, tuple[int, str]] = {}
        for p in w:
            if p.op in last:
                src = p.op
            else:
                feeds = [d for d in problem.op(p.op).deps if d in last]
                if not feeds:
                    continue
                src = max(feeds, key=lambda d: last[d][1])  # the first of a tie
            at, n = last[src]
            want[p.op] = (n, src == p.op)
            source[p.op] = (at, src)
        out.append((want, source))
        for p in w:
            last[p.op] = (wi, p.n)
    return out


def _wave_aligns(
    problem: Problem, waves: list[tuple[Piece, ...]]
) -> Iterator[list[tuple[Piece, ...]]]:
    """Each wave with all its pieces on their predecessors' allocations at once (then only
    its starting MetaOps'), where those fit the cluster: one edit that removes every move
    into the wave. Single-piece aligns (``_aligns``) cannot do it where the wave is full,
    or where each move alone is hidden behind the others (a boundary costs its busiest
    device)."""
    for wi, (want, source) in enumerate(_predecessors(problem, waves)):
        wave = waves[wi]
        seen: set[tuple[tuple[Piece, ...], ...]] = {(wave,)}
        for starting_only in (False, True):
            row = []
            for p in wave:
                n, continues = want.get(p.op, (p.n, False))
                if (starting_only and continues) or not problem.op(p.op).valid(n):
                    n = p.n
                row.append(Piece(p.op, p.first, p.end, n))
            tried = [(tuple(row),)]
            if sum(p.n for p in row) > problem.devices:  # not all fit: the costliest do,
                # or the wave splits into waves that each hold their share aligned
                tried = [(_partial_align(problem, wave, want, hold),) for hold in (True, False)]
                if not starting_only:
                    tried.append(_split_align(problem, wave, want, source))
            elif not starting_only:  # all fit in number, their predecessors maybe not at once
                tried.append(_split_align(problem, wave, want, source, merge=False))
            for new in tried:
                if None in new or new in seen:
                    continue
                seen.add(new)
                yield [*waves[:wi], *new, *waves[wi + 1 :]]


def _split_align(
    problem: Problem,
    wave: tuple[Piece, ...],
    want: dict[str, tuple[int, bool]],
    source: dict[str, tuple[int, str]],
    merge: bool = True,
) -> tuple[tuple[Piece, ...], ...] | tuple[None]:
    """``wave`` cut into consecutive waves, each holding its pieces on their predecessors'
    allocations ((None,) where it cannot be cut so, or would stay whole). Its pieces are
    independent of each other, so any order of the new waves keeps every dependency.
    Pieces whose predecessors ran in one wave had disjoint devices there and stay
    together, so placement can keep every input in place; with ``merge`` such groups share
    a wave while they fit (largest first: for a wave whose pieces aligned need more devices
    than the cluster has), without it each is a wave (for one whose aligned pieces fit in
    number, but whose predecessors ran in different waves on devices they may share). A
    piece with no predecessor keeps its allocation in the wave with the most room. Where
    the wave is a set of one-layer pieces (each task's heads after its encoders) an extra
    short wave costs less than the moves: on clip10 at 64 devices the heads, more devices'
    worth aligned than the cluster has, move activations every step in one wave and none as
    two, and multitask_clip at 64 devices plans a quicker step without merging."""
    groups: dict[tuple[int, int], list[Piece]] = {}
    fed: dict[tuple[int, int], set[str]] = {}
    loose: list[Piece] = []
    for p in wave:
        n = want[p.op][0] if p.op in want else 0
        if p.op not in source or not problem.op(p.op).valid(n):
            loose.append(p)
            continue
        at, src = source[p.op]
        key = (at, 0)
        while src in fed.get(key, ()):  # one producer's devices serve one consumer a wave
            key = (at, key[1] + 1)
        fed.setdefault(key, set()).add(src)
        groups.setdefault(key, []).append(Piece(p.op, p.first, p.end, n))
    bins: list[list[Piece]] = []
    for g in sorted(groups.values(), key=lambda g: -sum(p.n for p in g)):
        size = sum(p.n for p in g)
        if size > problem.devices:
            return (None,)
        home = next(
            (b for b in bins if merge and sum(p.n for p in b) + size <= problem.devices), None
        )
        if home is None:
            bins.append(home := [])
        home.extend(g)
    for p in loose:
        room = [problem.devices - sum(q.n for q in b) for b in bins]
        best = max(range(len(bins)), key=room.__getitem__, default=-1)
        if best < 0 or room[best] < p.n:
            bins.append([p])
        else:
            bins[best].append(p)
    if len(bins) < 2:
        return (None,)
    position = {p.op: i for i, p in enumerate(wave)}
    return tuple(tuple(sorted(b, key=lambda p: position[p.op])) for b in bins)


def _partial_align(
    problem: Problem, wave: tuple[Piece, ...], want: dict[str, tuple[int, bool]], hold: bool
) -> tuple[Piece, ...] | None:
    """``wave`` with as many pieces moved onto their predecessors' allocations as the
    cluster holds, those whose moves cost most first (``OpSpec.switch_s``: a continuing
    MetaOp's own activations, a starting one's producers'), and the rest side by side
    min-max on the devices left (None where nothing moves or the rest do not fit). Pieces
    on their predecessors' allocations already keep them with ``hold``; without it they
    share the devices left with the rest (on clip10 at 64 devices the quicker of the two).
    Where a wave of small pieces (a task's heads after
    wide encoders) cannot keep every input in place, keeping the largest inputs in place
    removes most of the moves."""

    def weight(p: Piece) -> float:
        _, continues = want[p.op]
        if continues:
            return problem.op(p.op).switch_s
        return sum(problem.op(d).switch_s for d in problem.op(p.op).deps)

    least = {p.op: problem.op(p.op).pareto[0] for p in wave}
    aligned = {p.op: p.n for p in wave if p.op in want and want[p.op][0] == p.n}
    kept = dict(aligned) if hold else {}
    movers = [p for p in wave if p.op in want and p.op not in aligned]
    movers = [p for p in movers if problem.op(p.op).valid(want[p.op][0])]
    free = problem.devices - sum(kept.values())
    pending = sum(least[p.op] for p in wave if p.op not in kept)
    moved = False
    for p in sorted(movers, key=weight, reverse=True):
        n = want[p.op][0]
        if free - n >= pending - least[p.op]:
            kept[p.op] = n
            free -= n
            pending -= least[p.op]
            moved = True
    if not moved or free < 0:
        return None
    others = [p for p in wave if p.op not in kept]
    alloc: dict[str, int] = {}
    if others:
        got = min_max([problem.op(p.op) for p in others], free, {p.op: p.layers for p in others})
        if got is None:
            return None
        alloc = got
    return tuple(
        Piece(p.op, p.first, p.end, kept[p.op] if p.op in kept else alloc[p.op]) for p in wave
    )


def _better(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """``a`` lexicographically below ``b`` by more than rounding noise (relative 1e-7)."""
    for x, y in zip(a, b, strict=True):
        if x < y - 1e-7 * abs(y) - 1e-15:
            return True
        if x > y + 1e-7 * abs(y) + 1e-15:
            return False
    return False


def _variants(trial: Schedule, refine: Callable[[Schedule], Schedule] | None) -> Iterator[Schedule]:
    """The edit as it comes, then (only if that did not help) refined."""
    yield trial
    if refine is not None:
        yield refine(trial)


def polish(
    problem: Problem,
    sched: Schedule,
    objective: Objective,
    seconds: float,
    compute_cap: float | None = None,
    refine: Callable[[Schedule], Schedule] | None = None,
) -> Schedule:
    """First-improvement local search for at most ``seconds`` (see the module docstring).

    ``objective`` returns a tuple compared lexicographically (memory overflow, ..., time).
    ``compute_cap``: once the schedule's compute (sum of wave durations) is within it, no
    edit may take it above: trading compute for less communication stops at the cap. Such
    edits are rejected before placement, which is what an objective evaluation costs.
    ``refine``: re-splits a dissolved schedule's layers (``resplit``); without it, a
    dissolve is tried as it comes.
    """
    deadline = time.perf_counter() + seconds
    best = sched
    best_key = objective(sched)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        waves = list(best.waves)
        capped = compute_cap is not None and best.compute_s(problem) <= compute_cap
        for gen in (_wave_aligns, _dissolves, _merges, _absorbs, _aligns):
            for cand in gen(problem, waves):
                if time.perf_counter() >= deadline:
                    return best
                trial = Schedule(best.name, tuple(cand), best.status, best.gap, best.notes)
                if schedule_errors(problem, trial):
                    continue
                for t in _variants(trial, refine if gen is _dissolves else None):
                    if capped and t.compute_s(problem) > compute_cap:
                        continue
                    key = objective(t)
                    if _better(key, best_key):
                        best, best_key, improved = t, key, True
                        break
                if improved:
                    break
            if improved:
                break
    return best


def rebalance(problem: Problem, sched: Schedule) -> Schedule:
    """Re-pick each wave's allocations to shorten it, keeping its pieces' layers.

    For fixed layer counts, each wave gets the min-max allocation of its pieces (``layout.min_max``:
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
