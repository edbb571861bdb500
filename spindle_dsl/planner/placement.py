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

Memory is the sum, per device, of ``cost.memory_bytes(op, n, layers)`` over the pieces it
runs: parameters and optimizer state stay for the whole iteration, and the activations of
every forward wave are kept until the backward waves use them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from spindle_dsl.planner.problem import Piece, Problem, Schedule

MemoryFn = Callable[[str, int, int], int]  # (op id, devices, layers) -> bytes per device


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


@dataclass(frozen=True)
class Placement:
    waves: tuple[tuple[PlacedPiece, ...], ...]
    memory: tuple[int, ...]  # predicted peak bytes per device id
    overflow: tuple[tuple[int, str, int], ...]  # (device, op that pushed it over, bytes) if any


@dataclass(frozen=True)
class Topology:
    """What placement needs of the cluster and the graph."""

    devices: int
    per_node: int
    capacity: int  # bytes per device
    partners: dict[str, tuple[str, ...]]  # ops sharing parameters with each op


class _Placer:
    def __init__(self, problem: Problem, topo: Topology, memory: MemoryFn):
        self.problem = problem
        self.topo = topo
        self.memory = memory
        self.used = [0] * topo.devices
        self.last: dict[str, tuple[int, ...]] = {}  # devices of each op's latest piece
        self.overflow: list[tuple[int, str, int]] = []

    def node(self, d: int) -> int:
        return d // self.topo.per_node

    def preferred(self, p: Piece) -> list[int]:
        if p.op in self.last:
            return list(self.last[p.op])
        out: list[int] = []
        for dep in self.problem.op(p.op).deps:
            out.extend(d for d in self.last.get(dep, ()) if d not in out)
        for other in self.topo.partners.get(p.op, ()):
            out.extend(d for d in self.last.get(other, ()) if d not in out)
        return out

    def fits(self, d: int, need: int) -> bool:
        return self.used[d] + need <= self.topo.capacity

    def choose(self, n: int, pref: list[int], free: set[int], need: int) -> list[int]:
        """``n`` free devices: preferred ones first, then whole or best-fit nodes."""
        chosen: list[int] = []
        pref_free = [d for d in pref if d in free and self.fits(d, need)]
        if pref_free:
            by_node: dict[int, list[int]] = {}
            for d in pref_free:
                by_node.setdefault(self.node(d), []).append(d)
            for _, ds in sorted(by_node.items(), key=lambda kv: -len(kv[1])):
                chosen.extend(ds[: n - len(chosen)])
                if len(chosen) == n:
                    return sorted(chosen)
        rest = [d for d in free if d not in chosen]
        ok = [d for d in rest if self.fits(d, need)]
        pool = ok if len(ok) >= n - len(chosen) else rest
        nodes: dict[int, list[int]] = {}
        for d in sorted(pool):
            nodes.setdefault(self.node(d), []).append(d)
        while len(chosen) < n:
            want = n - len(chosen)
            touched = {self.node(d) for d in chosen}
            local = [k for k in nodes if k in touched and nodes[k]]
            if local:
                k = local[0]
            else:
                fit = [k for k, ds in nodes.items() if len(ds) >= want]
                if fit and want <= self.topo.per_node:
                    k = min(fit, key=lambda k: (len(nodes[k]), self._load(nodes[k]), k))
                else:
                    k = max(nodes, key=lambda k: (len(nodes[k]), -self._load(nodes[k]), -k))
            take = self._contiguous(nodes[k], want)
            chosen.extend(take)
            nodes[k] = [d for d in nodes[k] if d not in take]
            if not nodes[k]:
                del nodes[k]
        return sorted(chosen)

    def _load(self, ds: list[int]) -> int:
        return sum(self.used[d] for d in ds)

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
        free = set(range(self.topo.devices))
        order = sorted(wave, key=lambda p: (p.op not in self.last, -p.n))
        placed: dict[str, PlacedPiece] = {}
        for p in order:
            need = self.memory(p.op, p.n, p.layers)
            ds = self.choose(p.n, self.preferred(p), free, need)
            free.difference_update(ds)
            for d in ds:
                self.used[d] += need
                if self.used[d] > self.topo.capacity:
                    self.overflow.append((d, p.op, self.used[d]))
            self.last[p.op] = tuple(ds)
            placed[p.op] = PlacedPiece(p.op, p.first, p.end, tuple(ds))
        return tuple(placed[p.op] for p in wave)


def place(problem: Problem, sched: Schedule, topo: Topology, memory: MemoryFn) -> Placement:
    """Give every piece of ``sched`` concrete device ids (see the module docstring)."""
    placer = _Placer(problem, topo, memory)
    waves = tuple(placer.place_wave(w) for w in sched.waves)
    return Placement(waves, tuple(placer.used), tuple(placer.overflow))
