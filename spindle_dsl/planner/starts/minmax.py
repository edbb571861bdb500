"""Min-max allocations of independent pieces side by side: the least time within which every
piece, each on the least pareto allocation that ends it so, fits on the devices.

Every layout that puts MetaOps side by side asks this (``baselines.balanced``,
``polish.rebalance``, ``taskpar``, ``wavefront.packed_schedule``). The greedy way, giving the
slowest piece its next pareto allocation until it no longer fits, steps through pareto points
one at a time: at 1,024 devices the rebalance of a 50-task plan takes millions of steps, a
large share of a ``milp`` schedule's time. Here the least time is found by bisection (each
piece's least allocation within a time is itself a bisection over its pareto points), and the
devices left over then go to the piece that ends last, as the greedy way would give them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from spindle_dsl.planner.model.problem import OpSpec

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
    pieces (``min_max``), a task's groups (``taskpar``) and a level's lanes (``packing``)."""
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
