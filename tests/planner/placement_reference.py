"""The placement before it was vectorised (kept verbatim as a test oracle): per-device Python
sets and loops. ``test_placement_equivalence`` checks that ``planner.evaluate.placement`` makes
exactly the same choices, so plans stay what they were while large clusters place in milliseconds.
The shard order of each group (``planner.evaluate.placement``), added since, is applied alike."""

from __future__ import annotations

import numpy as np

from spindle_dsl.planner.evaluate.ledger import Ledger
from spindle_dsl.planner.evaluate.placement import PlacedPiece, Placement, Topology, order_like
from spindle_dsl.planner.model.problem import Piece, Problem, Schedule


class _Placer:
    def __init__(self, problem: Problem, topo: Topology, ledger: Ledger):
        self.problem = problem
        self.topo = topo
        self.ledger = ledger
        self.used = np.zeros(topo.devices)  # bytes per device (an upper bound while placing)
        self.node_used = [0.0] * (-(-topo.devices // topo.per_node))  # bytes per node
        self.last: dict[str, tuple[int, ...]] = {}  # devices of each op's latest piece
        self.pushed: dict[int, str] = {}  # op that first took a device past its capacity
        self.last_op: dict[int, str] = {}

    def node(self, d: int) -> int:
        return d // self.topo.per_node

    def preferred(self, p: Piece) -> list[int]:
        if p.op in self.last:
            return list(self.last[p.op])
        out: dict[int, None] = {}
        for dep in self.problem.op(p.op).deps:
            out.update(dict.fromkeys(self.last.get(dep, ())))
        for other in self.topo.partners.get(p.op, ()):
            out.update(dict.fromkeys(self.last.get(other, ())))
        return list(out)

    def fits(self, d: int, need: np.ndarray) -> bool:
        return bool(self.used[d] + need[d] <= self.topo.capacity)

    def anchor(
        self, n: int, pref: list[int], free: dict[int, set[int]], need: np.ndarray
    ) -> list[int]:
        """Up to ``n`` of the preferred devices that are free (and fit), fullest node first.

        ``free`` maps node -> its free devices and is updated in place.
        """
        pref_free = [d for d in pref if d in free.get(self.node(d), ()) and self.fits(d, need)]
        by_node: dict[int, list[int]] = {}
        for d in pref_free:
            by_node.setdefault(self.node(d), []).append(d)
        chosen: list[int] = []
        for _, ds in sorted(by_node.items(), key=lambda kv: -len(kv[1])):
            chosen.extend(ds[: n - len(chosen)])
            if len(chosen) == n:
                break
        for d in chosen:
            free[self.node(d)].discard(d)
        return chosen

    def complete(
        self, n: int, chosen: list[int], free: dict[int, set[int]], need: np.ndarray
    ) -> list[int]:
        """Add free devices to ``chosen`` until it has ``n``: first in the nodes it already
        touches, then the best-fitting node (or whole nodes for large groups)."""
        chosen = list(chosen)
        tight = bool(np.max(self.used + need) > self.topo.capacity)
        # where memory is tight, count only the devices this piece still fits on
        room = {
            k: (sum(1 for d in ds if self.fits(d, need)) if tight else len(ds))
            for k, ds in free.items()
            if ds
        }
        touched = {self.node(d) for d in chosen}
        while len(chosen) < n:
            want = n - len(chosen)
            if tight and not any(room.values()):
                room = {k: len(ds) for k, ds in free.items() if ds}  # overflow is unavoidable
                tight = False
            local = [k for k in touched if room.get(k)]
            if local:
                k = local[0]
            else:
                live = [k for k, r in room.items() if r]
                fit = [k for k in live if room[k] >= want]
                if fit and want <= self.topo.per_node:
                    k = min(fit, key=lambda k: (room[k], self.node_used[k], k))
                else:
                    k = max(live, key=lambda k: (room[k], -self.node_used[k], -k))
            pool = sorted(free[k])
            ok = [d for d in pool if self.fits(d, need)] if tight else pool
            take = self._contiguous(ok, want)
            chosen.extend(take)
            free[k].difference_update(take)
            room[k] -= len(take)
            touched.add(k)
        return sorted(chosen)

    @staticmethod
    def _contiguous(ds: list[int], want: int) -> list[int]:
        """``want`` devices from sorted ``ds``, as one contiguous id run when there is one."""
        if len(ds) <= want:
            return list(ds)
        for i in range(len(ds) - want + 1):
            if ds[i + want - 1] - ds[i] == want - 1:
                return ds[i : i + want]
        return ds[:want]

    def source(self, p: Piece) -> tuple[int, ...] | None:
        if p.op in self.last:
            return self.last[p.op]
        deps = [d for d in self.problem.op(p.op).deps if d in self.last]
        if not deps:
            return None
        return self.last[max(deps, key=lambda d: self.topo.weight.get(d, 0.0))]

    def place_wave(self, wave: tuple[Piece, ...]) -> tuple[PlacedPiece, ...]:
        """Two passes: every piece first claims what it can of its preferred devices (the
        pieces that would move the most bytes first), then each completes its group."""
        free: dict[int, set[int]] = {}
        for d in range(self.topo.devices):
            free.setdefault(self.node(d), set()).add(d)
        needs = {p.op: self.ledger.need(p) for p in wave}
        order = sorted(wave, key=lambda p: (p.op not in self.last, -self.topo.weight.get(p.op, 0)))
        anchored = {p.op: self.anchor(p.n, self.preferred(p), free, needs[p.op]) for p in order}
        placed: dict[str, PlacedPiece] = {}
        for p in sorted(wave, key=lambda p: -p.n):
            need = needs[p.op]
            ds = self.complete(p.n, anchored[p.op], free, need)
            source = self.source(p)
            if source is not None:  # the shard order (added after the vectorisation)
                ds = order_like(np.array(ds), np.array(source), self.topo.per_node).tolist()
            self.ledger.add(p, ds, need)
            for d in ds:
                self.used[d] += need[d]
                self.node_used[self.node(d)] += float(need[d])
                self.last_op[d] = p.op
                if self.used[d] > self.topo.capacity:
                    self.pushed.setdefault(d, p.op)
            placed[p.op] = PlacedPiece(p.op, p.first, p.end, tuple(ds))
        for p in wave:
            self.last[p.op] = placed[p.op].devices
        return tuple(placed[p.op] for p in wave)


def place(problem: Problem, sched: Schedule, topo: Topology, ledger: Ledger) -> Placement:
    """Give every piece of ``sched`` concrete device ids (see the module docstring);
    ``ledger`` starts empty and ends holding the placement's memory."""
    placer = _Placer(problem, topo, ledger)
    waves = tuple(placer.place_wave(w) for w in sched.waves)
    memory = ledger.memory()
    overflow = tuple(
        (d, placer.pushed.get(d, placer.last_op.get(d, "")), b)
        for d, b in enumerate(memory)
        if b > topo.capacity
    )
    fullest = ledger.breakdown(max(range(len(memory)), key=memory.__getitem__)) if memory else None
    return Placement(waves, memory, overflow, fullest)
