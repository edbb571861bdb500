"""Device memory during placement: what a piece would add to each device, and the exact peak.

Placement asks a ledger two things: ``need(piece)``, the bytes the piece would add on each
device id (so a device that already holds a shared module's layers is cheaper for another
MetaOp of that module), and ``add(piece, devices)``. ``memory()`` gives the predicted peak per
device once every piece is placed.

``PartLedger`` follows the cost model's ``slice_memory`` (see ``cost.base``): a parameter part
counts once per device; its sharded optimizer state is split over every device that holds it,
which is only known at the end, so while placing, a device is charged its share over the
piece's own group (an upper bound: the final group contains it), and ``memory()`` recomputes
it exactly. Activations kept for backward add up; working sets count only the largest.

``PieceLedger`` serves cost models with only ``memory_bytes``: every piece adds its own
figure, parameters included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from spindle_dsl.cost.base import PartBytes, SliceMemory
from spindle_dsl.planner.problem import Piece

SliceFn = Callable[[str, int, int, int], SliceMemory]  # (op id, n, first, end) -> per device
BytesFn = Callable[[str, int, int], int]  # (op id, n, layers) -> bytes per device


class Ledger(Protocol):
    def need(self, piece: Piece) -> np.ndarray: ...

    def add(self, piece: Piece, devices: Iterable[int], need: np.ndarray) -> None: ...

    def memory(self) -> tuple[int, ...]: ...

    def breakdown(self, device: int) -> DeviceBreakdown: ...


@dataclass(frozen=True)
class DeviceBreakdown:
    """What fills one device: kept activations per op, parameter state, the working set."""

    kept: dict[str, int]
    state: int
    working: int


class PieceLedger:
    """Every piece adds ``memory_bytes(op, n, layers)`` to each of its devices."""

    def __init__(self, devices: int, memory: BytesFn):
        self.fn = memory
        self.used = np.zeros(devices)
        self.by_op: list[dict[str, int]] = [{} for _ in range(devices)]

    def need(self, piece: Piece) -> np.ndarray:
        return np.full(len(self.used), float(self.fn(piece.op, piece.n, piece.layers)))

    def add(self, piece: Piece, devices: Iterable[int], need: np.ndarray) -> None:
        for d in devices:
            self.used[d] += need[d]
            self.by_op[d][piece.op] = self.by_op[d].get(piece.op, 0) + int(need[d])

    def memory(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.used)

    def breakdown(self, device: int) -> DeviceBreakdown:
        return DeviceBreakdown(dict(self.by_op[device]), 0, 0)


@dataclass(frozen=True)
class _Run:
    """Part bytes of a slice per layer: layers ``[first, end)`` of a ``family`` of identical
    parts (a module's layers; an input stage or head is a family of one)."""

    family: str
    first: int
    end: int
    replicated: float  # per layer, per device holding it
    sharded: float  # per layer, the whole optimizer state


@dataclass(frozen=True)
class _Slice:
    kept: int
    working: int
    runs: tuple[_Run, ...]


def _runs(parts: Iterable[PartBytes]) -> tuple[_Run, ...]:
    out = []
    for p in parts:
        if p.layers is None:
            out.append(_Run(p.key, 0, 1, float(p.replicated), float(p.sharded)))
        else:
            k = p.count
            a, b = p.layers
            out.append(_Run(p.module + "/layers", a, b, p.replicated / k, p.sharded / k))
    return tuple(out)


class PartLedger:
    """Parameter parts deduplicated per device, optimizer state sharded over their holders.

    Rows are runs of identical layers rather than layers, so the ledger's size follows the
    number of distinct piece boundaries, not the layer count: a module's rows tile the layers
    some slice holds, split where a new slice starts or ends inside one (the split rows copy
    what each device holds, per layer, so the sums stay exact).

    Columns are *classes* of devices rather than devices: devices that have held exactly the
    same slices are in one class (at first, all of them), and a class splits when a piece
    takes some of its devices but not all. Pieces take contiguous groups, so a plan on 65,536
    devices has a few hundred classes, and pricing a piece costs that, not 65,536 per row.
    """

    def __init__(self, devices: int, slice_memory: SliceFn):
        self.fn = slice_memory
        self.devices = devices
        self.cache: dict[tuple[str, int, int, int], _Slice] = {}
        self.kept_log: list[tuple[str, np.ndarray, int]] = []  # (op, devices, kept bytes)
        self.tiles: dict[str, list[tuple[int, int, int]]] = {}  # family -> (first, end, row)
        self.length: list[int] = []  # layers per row
        self.sharded: list[float] = []  # optimizer bytes per layer, per row
        self.cls = np.zeros(devices, dtype=int)  # each device's class
        self.size = np.zeros(16, dtype=int)  # devices per class
        self.size[0] = devices
        self.classes = 1
        self.kept = np.zeros(16)  # per class
        self.working = np.zeros(16)
        self.held = np.zeros((64, 16), dtype=bool)  # row x class
        self.rep = np.zeros((64, 16))  # replicated bytes per layer held, row x class

    def _slice(self, piece: Piece) -> _Slice:
        key = (piece.op, piece.n, piece.first, piece.end)
        if key not in self.cache:
            sm = self.fn(*key)
            self.cache[key] = _Slice(sm.kept, sm.working, _runs(sm.parts))
        return self.cache[key]

    def _new_row(self, length: int, sharded: float, like: int | None = None) -> int:
        row = len(self.length)
        if row == len(self.held):
            self.held = _grown(self.held, 0)
            self.rep = _grown(self.rep, 0)
        self.length.append(length)
        self.sharded.append(sharded)
        if like is not None:
            self.held[row] = self.held[like]
            self.rep[row] = self.rep[like]
        return row

    def _new_class(self, like: int) -> int:
        c = self.classes
        if c == len(self.size):
            self.size, self.kept, self.working = (
                _grown(a, 0) for a in (self.size, self.kept, self.working)
            )
            self.held = _grown(self.held, 1)
            self.rep = _grown(self.rep, 1)
        self.kept[c], self.working[c] = self.kept[like], self.working[like]
        self.held[:, c], self.rep[:, c] = self.held[:, like], self.rep[:, like]
        self.classes += 1
        return c

    def _tile(self, run: _Run) -> list[int]:
        """The rows exactly covering ``run``'s layers, splitting or adding rows as needed."""
        tiles = self.tiles.setdefault(run.family, [])
        out: list[tuple[int, int, int]] = []
        pos = run.first
        for first, end, row in tiles:
            if end <= pos or first >= run.end:
                out.append((first, end, row))
                continue
            if first < pos:  # split off the part before the run
                self.length[row] = pos - first
                out.append((first, pos, row))
                row = self._new_row(end - pos, self.sharded[row], like=row)
                first = pos
            if first > pos:  # a gap no slice held yet
                out.append((pos, first, self._new_row(first - pos, run.sharded)))
            if end > run.end:  # split off the part after the run
                self.length[row] = run.end - first
                out.append((first, run.end, row))
                after = self._new_row(end - run.end, self.sharded[row], like=row)
                out.append((run.end, end, after))
            else:
                out.append((first, end, row))
            pos = min(end, run.end)
        if pos < run.end:
            out.append((pos, run.end, self._new_row(run.end - pos, run.sharded)))
        out.sort()
        self.tiles[run.family] = out
        return [row for first, end, row in out if first < run.end and end > run.first]

    def _rows(self, s: _Slice) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rows, layers per row, replicated per layer, sharded per layer) of a slice."""
        rows: list[int] = []
        rep: list[float] = []
        for run in s.runs:
            got = self._tile(run)
            rows.extend(got)
            rep.extend([run.replicated] * len(got))
        idx = np.array(rows, dtype=int)
        lengths = np.array([self.length[r] for r in rows], dtype=float)
        shard = np.array([self.sharded[r] for r in rows], dtype=float)
        return idx, lengths, np.array(rep, dtype=float), shard

    def need(self, piece: Piece) -> np.ndarray:
        s = self._slice(piece)
        k = self.classes
        out = s.kept + np.maximum(0.0, s.working - self.working[:k])
        if s.runs:
            rows, lengths, rep, shard = self._rows(s)
            w = lengths[:, None]
            rep_gain = (w * np.maximum(0.0, rep[:, None] - self.rep[rows, :k])).sum(axis=0)
            share = (shard / piece.n)[:, None]
            share_gain = (w * np.where(self.held[rows, :k], 0.0, share)).sum(axis=0)
            out = out + rep_gain + share_gain
        return out[self.cls]

    def _whole_classes(self, ds: np.ndarray) -> np.ndarray:
        """Split classes so that ``ds`` is a union of whole classes; those classes."""
        of = self.cls[ds]
        order = np.argsort(of, kind="stable")
        uniq, start, count = np.unique(of[order], return_index=True, return_counts=True)
        out = uniq.copy()
        for i in np.nonzero(count < self.size[uniq])[0]:
            c = int(uniq[i])
            members = ds[order[start[i] : start[i] + count[i]]]
            new = self._new_class(c)
            self.cls[members] = new
            self.size[c] -= len(members)
            self.size[new] = len(members)
            out[i] = new
        return out

    def add(self, piece: Piece, devices: Iterable[int], need: np.ndarray) -> None:
        s = self._slice(piece)
        ds = np.asarray(devices if isinstance(devices, np.ndarray) else list(devices), dtype=int)
        if not len(ds):
            return
        cl = self._whole_classes(ds)
        self.kept[cl] += s.kept
        self.working[cl] = np.maximum(self.working[cl], s.working)
        self.kept_log.append((piece.op, ds, s.kept))
        if s.runs:
            rows, _, rep, _ = self._rows(s)
            grid = np.ix_(rows, cl)
            self.rep[grid] = np.maximum(self.rep[grid], rep[:, None])
            self.held[grid] = True

    def _state(self) -> np.ndarray:
        """Parameter bytes per class: each row's replicated bytes where held, and its share of
        the optimizer state, split over every device holding it."""
        rows, k = len(self.length), self.classes
        held = self.held[:rows, :k]
        holders = np.maximum((held * self.size[:k]).sum(axis=1), 1)
        lengths = np.array(self.length, dtype=float)[:, None]
        share = (np.array(self.sharded, dtype=float) / holders)[:, None]
        return (lengths * (self.rep[:rows, :k] + held * share)).sum(axis=0)

    def memory(self) -> tuple[int, ...]:
        k = self.classes
        total = self.kept[:k] + self.working[:k] + self._state()
        per_class = [int(x) for x in np.ceil(total)]  # Python ints: no int64 to overflow
        return tuple(map(per_class.__getitem__, self.cls.tolist()))

    def breakdown(self, device: int) -> DeviceBreakdown:
        kept: dict[str, int] = {}
        for op, ds, nbytes in self.kept_log:
            if device in ds:
                kept[op] = kept.get(op, 0) + nbytes
        c = int(self.cls[device])
        return DeviceBreakdown(kept, int(self._state()[c]), int(self.working[c]))


def _grown(a: np.ndarray, axis: int) -> np.ndarray:
    """``a`` twice as long along ``axis``, zero-filled."""
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, a.shape[axis])
    return np.pad(a, pad)
