"""The order of a piece's devices: which shard of the batch each one holds.

Inside a piece the runtime is data parallel: its ``i``-th device holds the ``i``-th contiguous
shard of the MetaOp's batch (``backends/torch/schedule``). So when a MetaOp continues on
another group, or a consumer starts on devices its producer used, the order of the new group,
not only its set, decides how many rows stay where they are: a device in both groups keeps
its rows only where its new position covers its old shard. Placement picks the set of
devices (``planner.evaluate.placement``); ``order_like`` picks the order. Sorted ids, the order
placement gave before, can move every row although the groups share devices: a consumer on
devices (39, 58) of a producer on (58, 59) moves both halves sorted, one as (58, 39).

The splits are taken as even (``i / n``), as ``cost.comm`` prices the moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

SMALL_GROUPS = 512  # devices in both groups up to which the order is matched pair by pair


def _stretches(source: Sequence[int], dest: Sequence[int]) -> list[tuple[int, int, int]]:
    """(length, holder in ``source``, holder in ``dest``) of every stretch of the batch between
    the breakpoints of both splits, the batch counted in ``len(source) * len(dest)`` units
    (shard ``i`` of ``m`` covers ``[i * n, (i + 1) * n)``), so no rounding creeps in."""
    m, n = len(source), len(dest)
    cuts = sorted({i * n for i in range(m + 1)} | {j * m for j in range(n + 1)})
    return [(b - a, source[a // n], dest[a // m]) for a, b in pairwise(cuts)]


def _moved(
    source: Sequence[int], dest: Sequence[int], per_node: int | None
) -> tuple[int, int, int]:
    """(the most one device sends or receives across nodes, the most in all, what stays put)
    re-sharding from ``source`` to ``dest``, in ``len(source) * len(dest)`` units; across
    nodes counts nothing without ``per_node``."""
    sent: dict[int, int] = {}
    got: dict[int, int] = {}
    far_sent: dict[int, int] = {}
    far_got: dict[int, int] = {}
    kept = 0
    for length, s, d in _stretches(source, dest):
        if s == d:
            kept += length
            continue
        sent[s] = sent.get(s, 0) + length
        got[d] = got.get(d, 0) + length
        if per_node is not None and s // per_node != d // per_node:
            far_sent[s] = far_sent.get(s, 0) + length
            far_got[d] = far_got.get(d, 0) + length
    far = max((*far_sent.values(), *far_got.values()), default=0)
    return far, max((*sent.values(), *got.values()), default=0), kept


def kept_share(source: Sequence[int], dest: Sequence[int]) -> float:
    """The share of the batch that sits on the same device split over ``source`` and over
    ``dest`` (each in shard order)."""
    if not len(source) or not len(dest):
        return 0.0
    return _moved(source, dest, None)[2] / (len(source) * len(dest))


def order_like(chosen: np.ndarray, source: np.ndarray, per_node: int | None = None) -> np.ndarray:
    """``chosen`` (device ids) in the order that keeps the most of ``source``'s rows in place
    (see the module docstring); ``chosen`` itself where nothing can stay. A group of the
    source's very devices keeps the source's order, so nothing moves. Small groups match
    shared devices to positions by the rows they keep, best pairs first, and keep that order
    where its busiest device sends or receives no more than in ``chosen``'s own order, first
    across nodes (``per_node`` devices a node: the slow links), then in all (then keeping at
    least as many rows); large ones (over ``SMALL_GROUPS`` devices in both) give
    each shared device the position holding the middle of its old shard, in numpy."""
    chosen, source = np.asarray(chosen), np.asarray(source)
    n, m = len(chosen), len(source)
    if not n or not m:
        return chosen
    if n + m > SMALL_GROUPS:
        if n == m and np.array_equal(np.sort(source), np.sort(chosen)):
            return source.copy()
        at = np.nonzero(np.isin(source, chosen))[0]  # source positions of the shared devices
        return _middles(chosen, source, at) if len(at) else chosen
    # small groups in plain Python: placement orders every piece of every candidate plan
    src, mine = source.tolist(), chosen.tolist()
    ids = set(mine)
    if n == m and ids == set(src):
        return source.copy()
    at = [i for i, d in enumerate(src) if d in ids]
    if not at:
        return chosen
    # keeping rows can leave one device more to receive than an order that moves them all:
    # the matched order only where its busiest device moves no more, as the time follows it
    got = _matched(mine, src, at)
    if got == mine:
        return chosen
    far, most, kept = _moved(src, got, per_node)
    far_0, most_0, kept_0 = _moved(src, mine, per_node)
    better = (far, most, -kept) <= (far_0, most_0, -kept_0)
    return np.asarray(got, dtype=chosen.dtype) if better else chosen


def _matched(chosen: list[int], source: list[int], at: list[int]) -> list[int]:
    """Every (shared device, position) pair that keeps rows, the pairs keeping the most taken
    first while both are free; the other devices in the positions left, in increasing id
    order (``chosen`` is sorted)."""
    n, m = len(chosen), len(source)
    pairs = []
    for i in at:  # shard i covers [i * n, (i + 1) * n) of m * n units, position j [j * m, ...)
        for j in range(i * n // m, min(-(-(i + 1) * n // m), n)):
            kept = min((i + 1) * n, (j + 1) * m) - max(i * n, j * m)
            if kept > 0:
                pairs.append((-kept, j, i))
    out: list[int | None] = [None] * n
    used: set[int] = set()
    for _, j, i in sorted(pairs):
        if out[j] is None and i not in used:
            out[j] = source[i]
            used.add(i)
    taken = {d for d in out if d is not None}
    rest = iter(d for d in chosen if d not in taken)
    return [d if d is not None else next(rest) for d in out]


def _middles(chosen: np.ndarray, source: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Each shared device at the position holding the middle of its old shard; of several
    claiming one position, the one keeping the most rows there."""
    n, m = len(chosen), len(source)
    want = ((at + 0.5) * n / m).astype(int)
    kept = np.minimum((at + 1) / m, (want + 1) / n) - np.maximum(at / m, want / n)
    by_gain = np.lexsort((-kept, want))
    _, first = np.unique(want[by_gain], return_index=True)
    win = by_gain[first]
    out = np.full(n, -1, dtype=chosen.dtype)
    out[want[win]] = source[at[win]]
    out[out < 0] = np.setdiff1d(chosen, source[at[win]])
    return out
