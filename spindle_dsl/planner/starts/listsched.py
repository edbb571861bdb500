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
from fractions import Fraction

from spindle_dsl.planner.model.problem import OpSpec, Piece, Problem, Schedule


@dataclass(frozen=True)
class Span:
    """One MetaOp run without a break on ``n`` devices from ``start`` to ``end`` seconds.

    Times are exact (``Fraction``s of the float durations summed): on a time axis of 10^8 s a
    60 us MetaOp still has an end after its start, so it still gets a wave of its own.
    """

    op: OpSpec
    n: int
    start: Fraction
    end: Fraction

    @classmethod
    def after(cls, op: OpSpec, n: int, start: Fraction) -> Span:
        """``op``'s whole run on ``n`` devices, starting at ``start``."""
        return cls(op, n, start, start + Fraction(op.layers * op.t(n)))


def waveify(spans: list[Span]) -> tuple[tuple[Piece, ...], ...]:
    """Cut concurrent spans into waves at every span end (see the module docstring).

    Exact times make the cut robust at any magnitude: every span has a positive length, so
    each of its layers lands in some wave, and a consumer's first wave comes after its
    producer's last (no tolerance that could merge a short span into its neighbour's wave).
    """
    cuts = sorted({Fraction(0)} | {s.start for s in spans} | {s.end for s in spans})
    at = {c: i for i, c in enumerate(cuts)}
    waves: list[list[Piece]] = [[] for _ in range(len(cuts) - 1)]
    for s in spans:
        lo = 0
        for i in range(at[s.start], at[s.end]):
            end = cuts[i + 1]
            if end >= s.end:
                hi = s.op.layers
            else:  # layers done by this cut, rounded (the float of an exact difference)
                hi = min(s.op.layers, max(0, round(float(end - s.start) / s.op.t(s.n))))
            if hi > lo:
                waves[i].append(Piece(s.op.id, lo, hi, s.n))
                lo = hi
    return tuple(tuple(w) for w in waves if w)


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
    running: list[tuple[Fraction, int, str]] = []  # (end, tiebreak, op)
    spans: list[Span] = []
    free, now, seq = problem.devices, Fraction(0), 0
    while ready or running:
        ready.sort(key=lambda i: -bottom[i])
        for i in list(ready):
            if alloc[i] <= free:
                ready.remove(i)
                free -= alloc[i]
                spans.append(Span.after(problem.op(i), alloc[i], now))
                heapq.heappush(running, (spans[-1].end, seq, i))
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
