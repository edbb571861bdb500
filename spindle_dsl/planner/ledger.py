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

from spindle_dsl.cost.base import SliceMemory
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
class _Slice:
    kept: int
    working: int
    parts: np.ndarray  # part indices
    replicated: np.ndarray  # bytes per device, per part
    sharded: np.ndarray  # bytes of the whole part, per part


class PartLedger:
    """Parameter parts deduplicated per device, optimizer state sharded over their holders."""

    def __init__(self, devices: int, slice_memory: SliceFn):
        self.fn = slice_memory
        self.devices = devices
        self.index: dict[str, int] = {}
        self.sharded: list[int] = []
        self.cache: dict[tuple[str, int, int, int], _Slice] = {}
        self.kept = np.zeros(devices)
        self.working = np.zeros(devices)
        self.kept_by_op: dict[str, np.ndarray] = {}  # op -> kept bytes per device
        rows = 64
        self.held = np.zeros((rows, devices), dtype=bool)
        self.rep = np.zeros((rows, devices))

    def _slice(self, piece: Piece) -> _Slice:
        key = (piece.op, piece.n, piece.first, piece.end)
        if key not in self.cache:
            sm = self.fn(*key)
            idx = []
            for p in sm.parts:
                if p.key not in self.index:
                    self.index[p.key] = len(self.sharded)
                    self.sharded.append(p.sharded)
                idx.append(self.index[p.key])
            self._grow(len(self.sharded))
            self.cache[key] = _Slice(
                sm.kept,
                sm.working,
                np.array(idx, dtype=int),
                np.array([p.replicated for p in sm.parts], dtype=float),
                np.array([p.sharded for p in sm.parts], dtype=float),
            )
        return self.cache[key]

    def _grow(self, rows: int) -> None:
        if rows <= len(self.held):
            return
        extra = max(rows, 2 * len(self.held)) - len(self.held)
        pad = ((0, extra), (0, 0))
        self.held = np.pad(self.held, pad)
        self.rep = np.pad(self.rep, pad)

    def need(self, piece: Piece) -> np.ndarray:
        s = self._slice(piece)
        out = s.kept + np.maximum(0.0, s.working - self.working)
        if len(s.parts):
            rows = s.parts
            rep_gain = np.maximum(0.0, s.replicated[:, None] - self.rep[rows]).sum(axis=0)
            share = (s.sharded / piece.n)[:, None]
            share_gain = np.where(self.held[rows], 0.0, share).sum(axis=0)
            out = out + rep_gain + share_gain
        return out

    def add(self, piece: Piece, devices: Iterable[int], need: np.ndarray) -> None:
        s = self._slice(piece)
        ds = np.fromiter(devices, dtype=int)
        if not len(ds):
            return
        self.kept[ds] += s.kept
        self.working[ds] = np.maximum(self.working[ds], s.working)
        if s.kept:
            per_op = self.kept_by_op.get(piece.op)
            if per_op is None:
                per_op = self.kept_by_op[piece.op] = np.zeros(self.devices)
            per_op[ds] += s.kept
        if len(s.parts):
            grid = np.ix_(s.parts, ds)
            self.rep[grid] = np.maximum(self.rep[grid], s.replicated[:, None])
            self.held[grid] = True

    def _state(self) -> np.ndarray:
        rows = len(self.sharded)
        held = self.held[:rows]
        holders = np.maximum(held.sum(axis=1), 1)
        share = np.array(self.sharded, dtype=float) / holders
        return self.rep[:rows].sum(axis=0) + (held * share[:, None]).sum(axis=0)

    def memory(self) -> tuple[int, ...]:
        total = self.kept + self.working + self._state()
        return tuple(int(x) for x in np.ceil(total))

    def breakdown(self, device: int) -> DeviceBreakdown:
        return DeviceBreakdown(
            {op: int(v[device]) for op, v in self.kept_by_op.items() if v[device]},
            int(self._state()[device]),
            int(self.working[device]),
        )
