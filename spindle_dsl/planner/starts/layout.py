"""What the layouts share: spans on a time axis cut into waves (``Span``, ``waveify``), and
min-max allocations of independent pieces side by side: the least time within which every
piece, each on the least pareto allocation that ends it so, fits on the devices.

Every layout that puts MetaOps side by side asks this (``baselines.balanced``,
``polish.rebalance``, ``crosslevel``, ``wavefront.packed_schedule``). The greedy way, giving the
slowest piece its next pareto allocation until it no longer fits, steps through pareto points
one at a time: at 1,024 devices the rebalance of a 50-task plan takes millions of steps, a
large share of a ``milp`` schedule's time. Here the least time is found by bisection (each
piece's least allocation within a time is itself a bisection over its pareto points), and the
devices left over then go to the piece that ends last, as the greedy way would give them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeVar

from spindle_dsl.planner.model.problem import OpSpec, Piece

BISECTIONS = 40  # relative precision 2^-40 on the wave's time

T = TypeVar("T")


def least_fitting(
    lo: float,
    hi: float,
    fit: Callable[[float], T | None],
    best: T,
    *,
    rounds: int = BISECTIONS,
    tolerance: float = 1e-12,
) -> T:
    """Bisection on a completion time: what ``fit`` lays out at the least time in (lo, hi]
    where it lays anything out (``fit`` returns None where its layout does not fit;
    ``best`` is its layout at ``hi``). Every min-max layout here is one of these: the wave's
    pieces (``min_max``), a task's groups (``crosslevel``) and a level's lanes
    (``wavefront.packed_schedule``)."""
    for _ in range(rounds):
        if hi - lo <= tolerance * hi:
            break
        mid = (lo + hi) / 2
        got = fit(mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    return best


def _layers(op: OpSpec, layers: Mapping[str, int] | None) -> int:
    return op.layers if layers is None else layers[op.id]


def least_allocations(
    ops: Sequence[OpSpec], seconds: float, layers: Mapping[str, int] | None = None
) -> dict[str, int] | None:
    """Each op's least pareto allocation that ends its layers within ``seconds``; None if
    some op cannot."""
    out = {}
    for o in ops:
        n = o.least_within(seconds, _layers(o, layers))
        if n is None:
            return None
        out[o.id] = n
    return out


def give_to_slowest(
    alloc: dict[str, int],
    ops: Sequence[OpSpec],
    free: int,
    layers: Mapping[str, int] | None = None,
) -> int:
    """Hand ``free`` devices out, in place: the op of ``alloc`` that ends last gets its next
    faster allocation that fits, until none can; returns the devices left."""
    by_id = {o.id: o for o in ops}
    blocked: set[str] = set()
    while free > 0:
        live = [i for i in alloc if i not in blocked]
        if not live:
            break
        slow = max(live, key=lambda i: _layers(by_id[i], layers) * by_id[i].t(alloc[i]))
        nxt = by_id[slow].next_faster(alloc[slow], alloc[slow] + free)
        if nxt is None:
            blocked.add(slow)
            continue
        free -= nxt - alloc[slow]
        alloc[slow] = nxt
    return free


def min_max(
    ops: Sequence[OpSpec], devices: int, layers: Mapping[str, int] | None = None
) -> dict[str, int] | None:
    """Allocations of ``ops`` side by side on ``devices`` (``layers`` each, default all of
    theirs) whose longest is least (module docstring); None if they do not fit side by side
    on their least allocations."""
    least = {o.id: o.pareto[0] for o in ops}
    if sum(least.values()) > devices:
        return None

    def seconds(o: OpSpec, n: int) -> float:
        return _layers(o, layers) * o.t(n)

    def fit(t: float) -> dict[str, int] | None:
        got = least_allocations(ops, t, layers)
        return got if got is not None and sum(got.values()) <= devices else None

    lo = max(seconds(o, o.pareto[-1]) for o in ops)  # no op ends sooner than this
    hi = max(seconds(o, o.pareto[0]) for o in ops)
    best = least_fitting(lo, hi, fit, least)
    give_to_slowest(best, ops, devices - sum(best.values()), layers)
    return best


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
    """Cut concurrent spans into waves at every span end: a wave between each two successive
    span starts or ends, holding every span running across it.

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
