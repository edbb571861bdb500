"""Device placement: which device ids run each piece of a wave schedule, and in which order
(``order_like``: which shard of the batch each device holds).

Schedules only say how many devices a piece needs; placement picks them, wave by wave, with
these preferences, most important first:

1. a MetaOp that continues from an earlier wave keeps its devices (no activation transfer);
2. a MetaOp that starts goes where its producers' outputs are (consumers co-located with
   producers), else where a MetaOp sharing its parameters ran (shared modules co-located);
3. a group that fits in a node stays inside one node, in a contiguous id range (best-fit
   node); larger groups take whole nodes first;
4. among equals, devices with the most free memory (memory balanced), and no device is filled
   past its capacity while another choice exists.

A ``Ledger`` (``planner.evaluate.ledger``) prices memory: what a piece would add to each device
(less on a device that already holds parameters it needs) and, once every piece is placed, each
device's predicted peak. Parameters and optimizer state stay for the whole iteration, and the
activations of every forward wave are kept until the backward waves use them.

The order of a piece's devices: which shard of the batch each one holds.

Inside a piece the runtime is data parallel: its ``i``-th device holds the ``i``-th contiguous
shard of the MetaOp's batch (``backends/torch/schedule``). So when a MetaOp continues on
another group, or a consumer starts on devices its producer used, the order of the new group,
not only its set, decides how many rows stay where they are: a device in both groups keeps
its rows only where its new position covers its old shard. Placement picks the set of
devices (``planner.evaluate.placement``); ``order_like`` picks the order. Sorted ids, the order
placement gave before, can move every row although the groups share devices: a consumer on
devices (39, 58) of a producer on (58, 59) moves both halves sorted, one as (58, 39).

The splits are taken as even (``i / n``), as ``cost.comm`` prices the moves.

``NodePool``: where a renaming (``planner.evaluate.relabel``) or a spread loss group's order
(``planner.evaluate.relabel.shard_order``) has no device that holds a piece's rows, the
next best is a free device of the same node (a link inside a node is ~12x faster than
across), else any: the first free one in the order given, so that the choice is
deterministic, each answered in amortised constant time (a search of a list per request
would make the renaming quadratic in the devices).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise

import numpy as np

from spindle_dsl.planner.evaluate.ledger import DeviceBreakdown, Ledger
from spindle_dsl.planner.model.problem import Piece, Problem, Schedule


@dataclass(frozen=True)
class PlacedPiece:
    op: str
    first: int
    end: int
    devices: tuple[int, ...]

    @property
    def n(self) -> int:
        return len(self.devices)

    @property
    def layers(self) -> int:
        return self.end - self.first

    @cached_property
    def ids(self) -> np.ndarray:
        """``devices`` as an array (timing and transfers work on arrays)."""
        return np.asarray(self.devices, dtype=int)


@dataclass(frozen=True)
class Placement:
    waves: tuple[tuple[PlacedPiece, ...], ...]
    memory: tuple[int, ...]  # predicted peak bytes per device id
    overflow: tuple[tuple[int, str, int], ...]  # (device, op that pushed it over, bytes) if any
    fullest: DeviceBreakdown | None = None  # what fills the device with the highest peak
    # lm sinks whose loss runs on these devices instead of their last piece's
    # (``planner.evaluate.relabel``; the plan's ``loss_devices``)
    loss_groups: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class Topology:
    """What placement needs of the cluster and the graph."""

    devices: int
    per_node: int
    capacity: int  # bytes per device
    partners: dict[str, tuple[str, ...]]  # ops sharing parameters with each op
    weight: dict[str, float] = field(default_factory=dict)  # bytes a move of the op costs
    # (group, source) -> the group in shard order (``order_like``, a pure function), shared by
    # every placement of one lever search: its candidates order the same groups again and
    # again (on qwen_val/audio_heavy at 64 devices, 2,749 orderings in 160 candidate plans of
    # one search, 602 of them distinct)
    orders: dict[tuple[str, bytes, str, bytes], np.ndarray] = field(
        default_factory=dict, compare=False, repr=False
    )


SMALL = 1024  # preferred devices up to which anchoring runs in plain Python
_IDS = list(range(1 << 16))  # one int object per device id (see ``place_wave``)


class _Placer:
    """Places one schedule wave by wave. Per-device state is held in numpy arrays and every
    step works per node or per group, never per device in Python, so a wave on 65,536
    devices costs milliseconds; the choices are exactly those the rules above describe."""

    def __init__(self, problem: Problem, topo: Topology, ledger: Ledger):
        self.problem = problem
        self.topo = topo
        self.ledger = ledger
        self.nodes = -(-topo.devices // topo.per_node)
        self.used = np.zeros(topo.devices)  # bytes per device (an upper bound while placing)
        self.node_used = np.zeros(self.nodes)  # bytes per node
        self.node_of = np.arange(topo.devices) // topo.per_node
        self.free = np.ones(topo.devices, dtype=bool)  # free in the wave being placed
        self.last: dict[str, tuple[int, ...]] = {}  # devices of each op's latest piece
        self.last_ids: dict[str, np.ndarray] = {}  # the same as arrays
        self.pushed = np.full(topo.devices, -1)  # op (index into op_names) that first took a
        # device past its capacity
        self.op_names: list[str] = []
        self.last_op = np.full(topo.devices, -1)  # index into op_names of a device's last op
        if topo.devices > len(_IDS):
            _IDS.extend(range(len(_IDS), topo.devices))

    def node(self, d: int) -> int:
        return d // self.topo.per_node

    def preferred(self, p: Piece) -> np.ndarray:
        """Devices to prefer, best first: the op's own last devices if it continues, else
        its producers' then its parameter partners' (each device once, first mention)."""
        if p.op in self.last:
            return self.last_ids[p.op]
        sources = [*self.problem.op(p.op).deps, *self.topo.partners.get(p.op, ())]
        seen = np.zeros(self.topo.devices, dtype=bool)
        out = []
        for src in sources:
            ids = self.last_ids.get(src)
            if ids is not None:
                new = ids[~seen[ids]]
                seen[new] = True
                out.append(new)
        return np.concatenate(out) if out else np.zeros(0, dtype=int)

    def source(self, p: Piece) -> np.ndarray | None:
        """The devices, in shard order, whose rows ``p`` reads: its MetaOp's last piece if it
        continues, else the last piece of its producer whose moves cost the most bytes
        (``Topology.weight``)."""
        if p.op in self.last_ids:
            return self.last_ids[p.op]
        deps = [d for d in self.problem.op(p.op).deps if d in self.last_ids]
        if not deps:
            return None
        return self.last_ids[max(deps, key=lambda d: self.topo.weight.get(d, 0.0))]

    def order(self, group: np.ndarray, source: np.ndarray) -> np.ndarray:
        """``order_like(group, source)``, once per pair in ``Topology.orders`` (read-only:
        the same array may stand for several pieces). Only groups ordered pair by pair are
        kept: larger ones order in numpy at about the cost of their key, and at 65,536
        devices their keys alone would fill gigabytes."""
        if len(group) + len(source) > SMALL_GROUPS:
            return order_like(group, source, self.topo.per_node)
        key = (group.dtype.str, group.tobytes(), source.dtype.str, source.tobytes())
        got = self.topo.orders.get(key)
        if got is None:
            got = order_like(group, source, self.topo.per_node)
            got = self.topo.orders[key] = got.copy() if got is group else got
            got.flags.writeable = False
        return got

    def fits(self, need: np.ndarray) -> np.ndarray:
        """Which devices ``need`` more bytes still fit on."""
        return self.used + need <= self.topo.capacity

    def anchor(self, n: int, pref: np.ndarray, need: np.ndarray) -> list[int]:
        """Up to ``n`` of the preferred devices that are free (and fit), from the node with the
        most of them first (ties: the node named first), in preference order within a node.
        Takes them off ``self.free``."""
        if not len(pref) or n <= 0:
            return []
        arr = pref[self.free[pref] & (self.used[pref] + need[pref] <= self.topo.capacity)]
        if not len(arr):
            return []
        chosen: list[int] = []
        if len(arr) <= SMALL:  # few devices: plain Python is quicker than numpy's set-up
            by_node: dict[int, list[int]] = {}
            for d in arr.tolist():
                by_node.setdefault(d // self.topo.per_node, []).append(d)
            for ds in sorted(by_node.values(), key=lambda ds: -len(ds)):
                chosen.extend(ds[: n - len(chosen)])
                if len(chosen) == n:
                    break
            self.free[chosen] = False
            return chosen
        nodes = self.node_of[arr]
        _, first_at, inverse, counts = np.unique(
            nodes, return_index=True, return_inverse=True, return_counts=True
        )
        # nodes in order of first appearance, then (stably) by decreasing count; devices
        # grouped by that order, each node's in preference order; the first n are taken
        appear = np.argsort(first_at, kind="stable")
        order = appear[np.argsort(-counts[appear], kind="stable")]
        rank = np.empty(len(order), dtype=int)
        rank[order] = np.arange(len(order))
        chosen = arr[np.argsort(rank[inverse], kind="stable")][:n].tolist()
        self.free[chosen] = False
        return chosen

    def complete(self, n: int, chosen: list[int], need: np.ndarray) -> np.ndarray:
        """Add free devices to ``chosen`` until it has ``n``: first in the nodes it already
        touches, then the best-fitting node (or whole nodes for large groups)."""
        chosen = list(chosen)
        per = self.topo.per_node
        fits = self.fits(need)
        tight = not bool(fits.all())
        # where memory is tight, count only the devices this piece still fits on
        room = np.bincount(
            self.node_of, weights=self.free & fits if tight else self.free, minlength=self.nodes
        ).astype(int)
        touched = set((np.asarray(chosen, dtype=int) // per).tolist())  # in the order of chosen
        touched_live = sum(1 for k in touched if room[k] > 0)  # touched nodes with room left
        live = int(np.count_nonzero(room))
        order = np.zeros(0, dtype=int)  # whole-node picks, best first (see below)
        at = 0
        while len(chosen) < n:
            want = n - len(chosen)
            if tight and not live:
                room = np.bincount(self.node_of, weights=self.free, minlength=self.nodes).astype(
                    int
                )
                tight = False  # overflow is unavoidable
                live = int(np.count_nonzero(room))
                touched_live = sum(1 for k in touched if room[k] > 0)
                order, at = np.zeros(0, dtype=int), 0
            k = -1
            if touched_live:
                k = next(k for k in touched if room[k] > 0)
            elif want <= per:
                fit = np.nonzero(room >= want)[0]
                if len(fit):  # the best-fitting node: least room, least used, lowest id
                    k = int(fit[np.lexsort((fit, self.node_used[fit], room[fit]))[0]])
            if k < 0:
                # the node with the most room, least used, lowest id; the key changes only
                # for nodes this loop empties, so one sort serves the whole group
                while at < len(order) and room[order[at]] == 0:
                    at += 1
                if at == len(order):
                    cand = np.nonzero(room)[0]
                    order = cand[np.lexsort((cand, self.node_used[cand], -room[cand]))]
                    at = 0
                if want > per:
                    # each node this branch picks is taken whole while more than a node's
                    # worth is wanted: take all such nodes of the order at once
                    ks = order[at:][room[order[at:]] > 0]
                    before = np.concatenate(([0], np.cumsum(room[ks])[:-1]))
                    batch = ks[want - before > per]
                    picked = np.zeros(self.nodes, dtype=bool)
                    picked[batch] = True
                    sel = picked[self.node_of] & self.free & (fits if tight else True)
                    devs = np.nonzero(sel)[0]
                    chosen.extend(devs.tolist())
                    self.free[devs] = False
                    room[batch] = 0
                    live -= len(batch)
                    touched.update(batch.tolist())
                    continue
                k = int(order[at])
            lo = k * per
            pool = (
                lo
                + np.nonzero(self.free[lo : lo + per] & (fits[lo : lo + per] if tight else True))[0]
            )
            take = self._contiguous([int(d) for d in pool], want)
            chosen.extend(take)
            self.free[take] = False
            before = room[k] > 0
            room[k] -= len(take)
            after = room[k] > 0
            if before and not after:
                live -= 1
            if k in touched:
                touched_live += int(after) - int(before)
            else:
                touched.add(k)
                touched_live += int(after)
        return np.sort(np.asarray(chosen, dtype=int))

    @staticmethod
    def _contiguous(ds: list[int], want: int) -> list[int]:
        """``want`` devices from sorted ``ds``, as one contiguous id run when there is one."""
        if len(ds) <= want:
            return list(ds)
        for i in range(len(ds) - want + 1):
            if ds[i + want - 1] - ds[i] == want - 1:
                return ds[i : i + want]
        return ds[:want]

    def place_wave(self, wave: tuple[Piece, ...]) -> tuple[PlacedPiece, ...]:
        """Two passes: every piece first claims what it can of its preferred devices (the
        pieces that would move the most bytes first), then each completes its group."""
        self.free[:] = True
        needs = {p.op: self.ledger.need(p) for p in wave}
        whole = len(wave) == 1 and wave[0].n == self.topo.devices
        anchored = {}
        if not whole:  # a piece on the whole cluster has nothing to choose
            order = sorted(
                wave, key=lambda p: (p.op not in self.last, -self.topo.weight.get(p.op, 0))
            )
            anchored = {p.op: self.anchor(p.n, self.preferred(p), needs[p.op]) for p in order}
        placed: dict[str, PlacedPiece] = {}
        for p in sorted(wave, key=lambda p: -p.n):
            need = needs[p.op]
            if whole:
                idx = np.arange(self.topo.devices)
            else:
                idx = self.complete(p.n, anchored[p.op], need)  # sorted device ids
            source = self.source(p)
            if source is not None:  # the shard order that moves the fewest rows
                idx = self.order(idx, source)
            self.ledger.add(p, idx, need)
            self.used[idx] += need[idx]
            self.node_used += np.bincount(self.node_of[idx], need[idx], self.nodes)
            self.op_names.append(p.op)
            self.last_op[idx] = len(self.op_names) - 1
            over = idx[(self.used[idx] > self.topo.capacity) & (self.pushed[idx] < 0)]
            self.pushed[over] = len(self.op_names) - 1
            # device ids shared by every tuple: a plan on 65,536 devices holds millions of them
            devices = tuple(map(_IDS.__getitem__, idx.tolist()))
            placed[p.op] = PlacedPiece(p.op, p.first, p.end, devices)
            placed[p.op].__dict__["ids"] = idx  # the cached array, already at hand
            self.last_ids[p.op] = idx
        for p in wave:
            self.last[p.op] = placed[p.op].devices
        return tuple(placed[p.op] for p in wave)

    def blamed(self, d: int) -> str:
        """The op that first took device ``d`` past its capacity, else the last on it."""
        i = int(self.pushed[d]) if self.pushed[d] >= 0 else int(self.last_op[d])
        return self.op_names[i] if i >= 0 else ""


def place(problem: Problem, sched: Schedule, topo: Topology, ledger: Ledger) -> Placement:
    """Give every piece of ``sched`` concrete device ids (see the module docstring);
    ``ledger`` starts empty and ends holding the placement's memory."""
    placer = _Placer(problem, topo, ledger)
    waves = tuple(placer.place_wave(w) for w in sched.waves)
    memory = ledger.memory()
    overflow = tuple((d, placer.blamed(d), b) for d, b in enumerate(memory) if b > topo.capacity)
    fullest = ledger.breakdown(max(range(len(memory)), key=memory.__getitem__)) if memory else None
    return Placement(waves, memory, overflow, fullest)


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


class NodePool:
    """Device ``ids`` not yet taken, in the order given; ``per_node`` devices to a node."""

    def __init__(self, ids: Iterable[int], per_node: int) -> None:
        self._order = deque(ids)
        self._left = set(self._order)
        self._by_node: dict[int, deque[int]] = {}
        for d in self._order:
            self._by_node.setdefault(d // per_node, deque()).append(d)

    def take(self, node: int) -> int:
        """The first free id of ``node``, else the first free id (one must be left)."""
        near = self._by_node.get(node)
        while near and near[0] not in self._left:
            near.popleft()
        pool = near if near else self._order
        while pool[0] not in self._left:
            pool.popleft()
        d = pool.popleft()
        self._left.discard(d)
        return d
