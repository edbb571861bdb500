"""Device placement: which device ids run each piece of a wave schedule.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from spindle_dsl.planner.evaluate.ledger import DeviceBreakdown, Ledger
from spindle_dsl.planner.evaluate.shard_order import SMALL_GROUPS, order_like
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
    # (``planner.evaluate.lossspread``; the plan's ``loss_devices``)
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
