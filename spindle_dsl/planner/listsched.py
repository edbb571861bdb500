"""Cross-level list scheduling of malleable MetaOps on a time axis, then cut into waves.

A second route to a cross-level plan, independent of MetaLevels: the classic CPA approach
to malleable tasks with precedences (Radulescu & van Gemund, "A low-cost approach towards
mixed task and data parallel scheduling", ICPP 2001):

1. allocation: start every MetaOp on its smallest allocation; while the critical path is
   longer than the average area (device-seconds / N), give the critical-path MetaOp with the
   best time saved per extra device-second its next faster allocation;
2. list scheduling: at each event, start ready MetaOps (inputs done) by decreasing bottom
   level (longest time to a sink) whenever their allocation fits the free devices.

``waveify`` then cuts the time axis at every MetaOp end into waves, splitting each MetaOp's
layers between waves by rounding its cumulative progress at the cuts, so the result obeys
the wave format (disjoint devices per wave, deps in strictly earlier waves).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import pairwise

from spindle_dsl.planner.problem import EPS, OpSpec, Piece, Problem, Schedule


@dataclass(frozen=True)
class Span:
    """One MetaOp run without a break on ``n`` devices from ``start`` to ``end`` seconds."""

    op: OpSpec
    n: int
    start: float
    end: float


def waveify(spans: list[Span]) -> tuple[tuple[Piece, ...], ...]:
    """Cut concurrent spans into waves at every span end (see the module docstring)."""
    cuts = sorted({0.0} | {s.start for s in spans} | {s.end for s in spans})

    def done(s: Span, at: float) -> int:
        if at >= s.end - EPS * max(s.end, 1e-30):
            return s.op.layers
        if at <= s.start:
            return 0
        return min(s.op.layers, max(0, round((at - s.start) / s.op.t(s.n))))

    waves: list[tuple[Piece, ...]] = []
    for a, b in pairwise(cuts):
        pieces = []
        for s in spans:
            if s.end <= a or s.start >= b:
                continue
            lo, hi = done(s, a), done(s, b)
            if hi > lo:
                pieces.append(Piece(s.op.id, lo, hi, s.n))
        if pieces:
            waves.append(tuple(pieces))
    return tuple(waves)


def cpa_allocation(problem: Problem) -> dict[str, int]:
    """Phase 1 of CPA: grow allocations on the critical path until it meets the area."""
    alloc = {o.id: o.pareto[0] for o in problem.ops}
    N = problem.devices
    for _ in range(sum(len(o.pareto) for o in problem.ops)):
        time = {o.id: o.layers * o.t(alloc[o.id]) for o in problem.ops}
        finish: dict[str, float] = {}
        via: dict[str, str | None] = {}
        for o in problem.ops:
            dep = max(o.deps, key=lambda d: finish[d], default=None)
            finish[o.id] = time[o.id] + (finish[dep] if dep else 0.0)
            via[o.id] = dep
        area = sum(time[i] * alloc[i] for i in time) / N
        end = max(finish, key=lambda i: finish[i])
        if finish[end] <= area:
            break
        path = []
        node: str | None = end
        while node is not None:
            path.append(node)
            node = via[node]
        best, best_score = None, -1.0
        for i in path:
            op = problem.op(i)
            nxt = op.next_faster(alloc[i], N)
            if nxt is None:
                continue
            saved = time[i] - op.layers * op.t(nxt)
            extra = op.layers * op.t(nxt) * nxt - time[i] * alloc[i]
            score = float("inf") if extra <= 0 else saved / extra
            if score > best_score:
                best, best_score = (i, nxt), score
        if best is None:
            break
        alloc[best[0]] = best[1]
    return alloc


def list_schedule(problem: Problem, alloc: dict[str, int]) -> list[Span]:
    """Phase 2 of CPA: event-driven list scheduling by bottom level."""
    time = {o.id: o.layers * o.t(alloc[o.id]) for o in problem.ops}
    consumers: dict[str, list[str]] = {o.id: [] for o in problem.ops}
    for o in problem.ops:
        for d in o.deps:
            consumers[d].append(o.id)
    bottom: dict[str, float] = {}
    for o in reversed(problem.ops):
        bottom[o.id] = time[o.id] + max((bottom[c] for c in consumers[o.id]), default=0.0)
    waiting = {o.id: len(o.deps) for o in problem.ops}
    ready = [o.id for o in problem.ops if not o.deps]
    running: list[tuple[float, int, str]] = []  # (end, tiebreak, op)
    spans: list[Span] = []
    free, now, seq = problem.devices, 0.0, 0
    while ready or running:
        ready.sort(key=lambda i: -bottom[i])
        for i in list(ready):
            if alloc[i] <= free:
                ready.remove(i)
                free -= alloc[i]
                spans.append(Span(problem.op(i), alloc[i], now, now + time[i]))
                heapq.heappush(running, (now + time[i], seq, i))
                seq += 1
        if not running:
            raise AssertionError("list scheduling stalled: an allocation exceeds the devices")
        now, _, i = heapq.heappop(running)
        free += alloc[i]
        done = [i]
        while running and running[0][0] <= now:
            done.append(heapq.heappop(running)[2])
            free += alloc[done[-1]]
        for j in done:
            for c in consumers[j]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    ready.append(c)
    return spans


def cpa_schedule(problem: Problem) -> Schedule:
    spans = list_schedule(problem, cpa_allocation(problem))
    return Schedule("cpa", waveify(spans))
