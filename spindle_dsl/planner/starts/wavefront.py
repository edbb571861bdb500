"""The paper's scheduler (`--scheduler paper`): allocation per MetaLevel, then greedy waves;
and the levels with their short MetaOps packed on shared devices (``packed_schedule``).

MetaLevels run one after another, as in Spindle. For each level: the continuous optimum and
the bi-point discretisation (``problem.bipoint``) give every MetaOp one or two (n, layers) tuples;
the wavefront scheduler then repeats four steps until the level's tuples are done:

1. propose: take MetaOps in decreasing order of remaining time and put one of each one's
   remaining tuples into the wave, the one with the most devices that still fits (a MetaOp's
   two tuples may run in either order: each only has to run once);
2. extend: while devices stay idle, give a MetaOp in the wave its next faster valid
   allocation that fits: first the one whose single layer outlasts the wave's shortest span
   the most (the wave cannot end before that layer), then the one with the most remaining
   time at its wave allocation, weighed again after each step;
3. align: each MetaOp takes the whole layers closest to the wave's shortest span (the least
   remaining time of a current tuple at its wave allocation; at least one layer); the wave
   lasts as long as the slowest of those rounded pieces, and every other MetaOp then runs the
   whole layers that end within that time, so none stops early while one layer runs long;
4. commit: the layers run are taken off the tuples, and the next wave starts.

Consecutive waves that run the same MetaOps on the same device counts merge into one: the
merged wave is never longer than the two (each MetaOp's layers add up, the slowest of the sums
is at most the sum of the slowest), and it saves a wave boundary.

A level-by-level start for the ``milp`` scheduler that runs short MetaOps one after another
on shared devices, where the level's continuous optimum gives them less than one device.

The continuous optimum of a MetaLevel gives every MetaOp n* devices so that all end together
at C*. Many-task jobs have MetaOps with n* well under 1: a small text or IMU encoder that one
device runs in a third of C* (bench/specs/clip10 at 64 devices: half of its encoders are
given well under one device). An integer layout that gives each its own device
(``baselines.balanced``) leaves that device idle for the rest of the level, and the level
MILP, at the size of such a level, does not find better in seconds. The
LP bound's solution (``lp_bound``) runs them from the start beside the large encoders, on
one device each, for about half the level: this layout gives that shape whole devices by
running two or three of them in turn on one.

The layout, per level: for a completion time C, every op that one device runs within C is
packed first-fit decreasing into *lanes*, one device each, holding ops in turn up to C; every
other op gets the least valid allocation that ends within C. The least C whose lanes and
allocations fit in the devices is found by bisection; devices left over go to the op that
ends last, one faster allocation at a time (``layout.give_to_slowest``). Levels run one after
another; spans are cut into waves at every boundary (``layout.waveify``): a large op
spans several waves at one allocation, its layers cut where the lanes' ops change, so it
moves nothing. As every start, the scheduler then improves it (layer re-splits,
rebalanced waves) and polishes it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from fractions import Fraction

from spindle_dsl.planner.model.problem import (
    EPS,
    OpSpec,
    Piece,
    Problem,
    Schedule,
    bipoint,
    level_optimum,
)
from spindle_dsl.planner.starts.layout import Span, give_to_slowest, least_fitting, waveify


@dataclass
class _Tuples:
    """Mutable bookkeeping of one MetaOp's remaining (n, layers) tuples within the level."""

    op: OpSpec
    tuples: list[list[int]]  # [n, remaining layers]
    next_layer: int = 0
    current: int = 0  # index of the tuple proposed for the wave being built
    version: int = 0  # bumped whenever ``extend`` re-weighs it (its heap entries go stale)

    def remaining_s(self) -> float:
        return sum(k * self.op.t(n) for n, k in self.tuples)

    @property
    def done(self) -> bool:
        return not self.tuples


def propose(states: list[_Tuples], devices: int) -> dict[str, int]:
    """Step 1: fill the devices with tuples, longest remaining time first."""
    free = devices
    chosen: dict[str, int] = {}
    for s in sorted(states, key=lambda s: -s.remaining_s()):
        fits = [i for i, (n, _) in enumerate(s.tuples) if n <= free]
        if fits:
            s.current = max(fits, key=lambda i: s.tuples[i][0])
            chosen[s.op.id] = s.tuples[s.current][0]
            free -= chosen[s.op.id]
    return chosen


def _span_s(state: _Tuples, n: int) -> float:
    """The remaining time of a MetaOp's current tuple at ``n`` devices."""
    return state.tuples[state.current][1] * state.op.t(n)


def _next_extension(
    states: dict[str, _Tuples],
    chosen: dict[str, int],
    by_layer: list[tuple[float, int, str]],
    by_span: list[tuple[float, int, str]],
    target: float,
) -> str | None:
    """The MetaOp that gets the next idle devices (``extend``'s order), or None when none
    can. The heaps hold (negated key, version, op id); stale entries are dropped here."""
    for heap in (by_layer, by_span):
        while heap and heap[0][1] != states[heap[0][2]].version:
            heapq.heappop(heap)
    if not by_layer:
        return None
    slowest = by_layer[0][2]
    if states[slowest].op.t(chosen[slowest]) > target * (1 + EPS):
        return slowest
    return by_span[0][2]


def extend(states: dict[str, _Tuples], chosen: dict[str, int], devices: int) -> dict[str, int]:
    """Step 2: hand idle devices, one valid allocation step at a time, to the MetaOps in the
    wave: first to the one whose single layer outlasts the wave's shortest span the most,
    since the wave cannot end before that layer; then to the one with the most remaining time
    at its wave allocation, which would otherwise finish the level last.

    Only the extended MetaOp's keys change at a step (the shortest span only falls), so two
    heaps with lazily dropped entries keep each step logarithmic in the wave's MetaOps.
    """
    free = devices - sum(chosen.values())
    by_layer = [(-states[i].op.t(n), states[i].version, i) for i, n in chosen.items()]
    by_span = [(-_span_s(states[i], n), states[i].version, i) for i, n in chosen.items()]
    heapq.heapify(by_layer)
    heapq.heapify(by_span)
    target = min(_span_s(states[i], n) for i, n in chosen.items())
    while free > 0:
        op_id = _next_extension(states, chosen, by_layer, by_span, target)
        if op_id is None:
            break
        s, n = states[op_id], chosen[op_id]
        s.version += 1  # its entries are stale either way
        m = s.op.next_faster(n, n + free)
        if m is None:  # the idle devices only shrink: it cannot get faster later either
            continue
        chosen[op_id], free = m, free - (m - n)
        heapq.heappush(by_layer, (-s.op.t(m), s.version, op_id))
        heapq.heappush(by_span, (-_span_s(s, m), s.version, op_id))
        target = min(target, _span_s(s, m))
    return chosen


def align(states: dict[str, _Tuples], chosen: dict[str, int]) -> tuple[Piece, ...]:
    """Step 3: round every MetaOp to whole layers, then fill the time those layers take.

    Each MetaOp first takes the whole layers closest to the wave's shortest span (at least
    one, at most what its tuple has left). The wave cannot end before the slowest of those
    rounded pieces, so that sets its time, and every MetaOp then runs as many whole layers as
    end within it: the others keep working while a MetaOp's one long layer runs.
    """
    per_layer = {i: states[i].op.t(n) for i, n in chosen.items()}
    left = {i: states[i].tuples[states[i].current][1] for i in chosen}
    target = min(_span_s(states[i], n) for i, n in chosen.items())
    rounded = {i: min(left[i], max(1, round(target / per_layer[i]))) for i in chosen}
    wave_s = max(rounded[i] * per_layer[i] for i in chosen)
    pieces = []
    for op_id, n in chosen.items():
        fit = int(wave_s * (1 + EPS) / per_layer[op_id])  # whole layers ending in the wave
        k = min(left[op_id], max(rounded[op_id], fit))
        start = states[op_id].next_layer
        pieces.append(Piece(op_id, start, start + k, n))
    return tuple(pieces)


def commit(states: dict[str, _Tuples], pieces: tuple[Piece, ...]) -> None:
    """Step 4: take the layers run off each MetaOp's proposed tuple."""
    for p in pieces:
        s = states[p.op]
        s.tuples[s.current][1] -= p.layers
        s.next_layer = p.end
        if s.tuples[s.current][1] == 0:
            s.tuples.pop(s.current)


def merge_repeats(waves: list[tuple[Piece, ...]]) -> list[tuple[Piece, ...]]:
    """Merge each run of consecutive waves that give the same MetaOps the same device counts
    into one wave whose pieces span the run's layers: never longer than the waves it joins,
    and one wave boundary (its barrier and fixed costs) instead of several."""
    out: list[tuple[Piece, ...]] = []
    for wave in waves:
        last = out[-1] if out else ()
        if {p.op: p.n for p in last} != {p.op: p.n for p in wave}:
            out.append(wave)
            continue
        ends = {p.op: p.end for p in wave}
        out[-1] = tuple(Piece(p.op, p.first, ends[p.op], p.n) for p in last)
    return out


def schedule_level(ops: list[OpSpec], devices: int) -> list[tuple[Piece, ...]]:
    """Allocate one MetaLevel (continuous optimum + bi-point) and cut it into waves."""
    opt = level_optimum(ops, devices)
    states = {o.id: _Tuples(o, [list(t) for t in bipoint(o, opt.n(o.id))]) for o in ops}
    waves: list[tuple[Piece, ...]] = []
    while True:
        live = [s for s in states.values() if not s.done]
        if not live:
            return merge_repeats(waves)
        chosen = extend(states, propose(live, devices), devices)
        pieces = align(states, chosen)
        commit(states, pieces)
        waves.append(pieces)


def paper_schedule(problem: Problem) -> Schedule:
    """Spindle's plan: each MetaLevel allocated and wave-scheduled in turn."""
    waves: list[tuple[Piece, ...]] = []
    for level in problem.levels:
        waves.extend(schedule_level([problem.op(i) for i in level], problem.devices))
    return Schedule("paper", tuple(waves), status="heuristic")


def _lanes(ops: list[OpSpec], seconds: float) -> list[list[OpSpec]]:
    """First-fit decreasing: ops that one device runs within ``seconds``, in turn per lane."""
    lanes: list[list[OpSpec]] = []
    loads: list[float] = []
    for o in sorted(ops, key=lambda o: -o.layers * o.t(1)):
        need = o.layers * o.t(1)
        for i, load in enumerate(loads):
            if load + need <= seconds:
                lanes[i].append(o)
                loads[i] += need
                break
        else:
            lanes.append([o])
            loads.append(need)
    return lanes


def _layout(ops: list[OpSpec], seconds: float) -> tuple[dict[str, int], list[list[OpSpec]]] | None:
    """Allocations of the ops that need more than a device, and the lanes of the rest, all
    within ``seconds``; None if some op cannot end within it."""
    alone: dict[str, int] = {}
    shared: list[OpSpec] = []
    for o in ops:
        n = o.least_within(seconds)
        if n is None:
            return None
        if n == 1 and o.valid(1):
            shared.append(o)
        else:
            alone[o.id] = n
    return alone, _lanes(shared, seconds)


def _devices(layout: tuple[dict[str, int], list[list[OpSpec]]]) -> int:
    alone, lanes = layout
    return sum(alone.values()) + len(lanes)


def pack_level(ops: list[OpSpec], devices: int) -> list[Span] | None:
    """The level's spans from time 0 (module docstring); None if even one op per device in
    turn does not fit (``devices`` below some op's least allocation plus one lane)."""
    hi = sum(o.layers * o.t(o.pareto[0]) for o in ops)  # everything in turn
    first = _layout(ops, hi)
    if first is None or _devices(first) > devices:
        return None

    def fit(seconds: float) -> tuple[dict[str, int], list[list[OpSpec]]] | None:
        got = _layout(ops, seconds)
        return got if got is not None and _devices(got) <= devices else None

    lo = max(o.layers * o.t(o.pareto[-1]) for o in ops)  # no op ends sooner than this
    best = least_fitting(lo, hi, fit, first, tolerance=1e-6)
    alone, lanes = best
    by_id = {o.id: o for o in ops}
    give_to_slowest(alone, [by_id[i] for i in alone], devices - _devices(best))
    spans = [Span.after(by_id[i], n, Fraction(0)) for i, n in alone.items()]
    for lane in lanes:
        at = Fraction(0)
        for o in lane:
            spans.append(Span.after(o, 1, at))
            at = spans[-1].end
    return spans


def packed_schedule(problem: Problem) -> Schedule | None:
    """MetaLevels in turn, each packed (``pack_level``); None where some level does not pack
    (the caller keeps its other starts)."""
    waves = []
    for level in problem.levels:
        spans = pack_level([problem.op(i) for i in level], problem.devices)
        if spans is None:
            return None
        waves.extend(waveify(spans))
    return Schedule("packed", tuple(waves))
