"""Device memory during placement: what a piece would add to each device, and the exact peak.

Placement asks a ledger two things: ``need(piece)``, the bytes the piece would add on each
device id (so a device that already holds a shared module's layers is cheaper for another
MetaOp of that module), and ``add(piece, devices)``. ``memory()`` gives the predicted peak per
device once every piece is placed.

``PartLedger`` follows the cost model's ``slice_memory`` (see ``cost.base``): a parameter part
counts once per device; its sharded optimizer state (and gradient shard) is split over every
device that holds it, which is only known at the end, so while placing, a device is charged
its share over the piece's own group (an upper bound: the final group contains it), and
``memory()`` recomputes it exactly. Activations kept for backward and the loss phase's tensors
add up; working sets count only the largest; gradients count where the slices'
``GradientLife`` says they are alive at the device's peak (the larger of the end of the
forward and the end of the backward), so what a piece adds is the change in that peak.

``PieceLedger`` serves cost models with only ``memory_bytes``: every piece adds its own
figure, parameters included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from spindle_dsl.cost.base import GradientLife, PartBytes, SliceMemory
from spindle_dsl.planner.model.problem import Piece

SliceFn = Callable[[str, int, int, int], SliceMemory]  # (op id, n, first, end) -> per device
BytesFn = Callable[[str, int, int], int]  # (op id, n, layers) -> bytes per device


class Ledger(Protocol):
    def need(self, piece: Piece) -> np.ndarray: ...

    def add(self, piece: Piece, devices: Iterable[int], need: np.ndarray) -> None: ...

    def memory(self) -> tuple[int, ...]: ...

    def breakdown(self, device: int) -> DeviceBreakdown: ...


@dataclass(frozen=True)
class DeviceBreakdown:
    """What fills one device at its peak: kept activations per op, parameter state (weights
    and optimizer state), the largest working set, the loss phase's tensors, and what the
    gradients alive add to the peak."""

    kept: dict[str, int]
    state: int
    working: int
    loss: int = 0
    gradients: int = 0


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
    grads: float = 0.0  # per layer, per device holding it: its whole gradient
    grads_sharded: float = 0.0  # per layer, the whole gradient reduce-scattered over holders


@dataclass(frozen=True)
class _Slice:
    kept: int
    working: int
    runs: tuple[_Run, ...]
    loss: int
    life: GradientLife


def _runs(parts: Iterable[PartBytes]) -> tuple[_Run, ...]:
    out = []
    for p in parts:
        k = p.count
        if p.layers is None:
            family, a, b = p.key, 0, 1
        else:
            family, (a, b) = p.module + "/layers", p.layers
        out.append(
            _Run(
                family,
                a,
                b,
                p.replicated / k,
                p.sharded / k,
                p.grads / k,
                p.grads_sharded / k,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class _Rows:
    """The ledger rows a slice covers and, per layer of each, what the slice holds."""

    idx: np.ndarray
    lengths: np.ndarray
    rep: np.ndarray
    sharded: np.ndarray
    grads: np.ndarray
    grads_sharded: np.ndarray


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
        # a family's tiling changes only when a slice boundary falls inside one of its rows
        # (or on layers no slice held yet): each change bumps its epoch, and a slice's rows
        # are kept until one of its families' epochs moves (``_rows``)
        self.epoch: dict[str, int] = {}
        self.rows_of: dict[int, tuple[tuple[int, ...], _Rows]] = {}  # id(slice) -> rows
        self.length: list[int] = []  # layers per row
        self.sharded: list[float] = []  # optimizer bytes per layer, per row
        self.grads_sharded: list[float] = []  # whole gradient bytes per layer, per row
        self.life = GradientLife()  # the slices' (a ledger prices one setting of the levers)
        self.cls = np.zeros(devices, dtype=int)  # each device's class
        self.size = np.zeros(16, dtype=int)  # devices per class
        self.size[0] = devices
        self.classes = 1
        self.kept = np.zeros(16)  # per class
        self.loss = np.zeros(16)
        self.working = np.zeros(16)
        self.grads = np.zeros(16)  # whole gradient bytes held, per class
        self.shards = np.zeros(16)  # gradient shards, as charged over each piece's group
        # per class, how many pieces have added to its parameter rows: what ``need`` priced
        # for a class still holds at ``add`` while its count is the same (``_priced``)
        self.version = np.zeros(16, dtype=np.int64)
        self.priced: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.held = np.zeros((64, 16), dtype=bool)  # row x class
        self.rep = np.zeros((64, 16))  # replicated bytes per layer held, row x class
        self.grad = np.zeros((64, 16))  # whole gradient bytes per layer held, row x class

    def _slice(self, piece: Piece) -> _Slice:
        key = (piece.op, piece.n, piece.first, piece.end)
        if key not in self.cache:
            sm = self.fn(*key)
            self.cache[key] = _Slice(sm.kept, sm.working, _runs(sm.parts), sm.loss, sm.life)
            self.life = sm.life
        return self.cache[key]

    def _new_row(
        self, length: int, sharded: float, grads_sharded: float, like: int | None = None
    ) -> int:
        row = len(self.length)
        if row == len(self.held):
            self.held, self.rep, self.grad = (
                _grown(a, 0) for a in (self.held, self.rep, self.grad)
            )
        self.length.append(length)
        self.sharded.append(sharded)
        self.grads_sharded.append(grads_sharded)
        if like is not None:
            for m in (self.held, self.rep, self.grad):
                m[row] = m[like]
        return row

    def _split_row(self, row: int, length: int) -> int:
        """A new row of ``length`` layers holding what ``row`` holds, per layer."""
        return self._new_row(length, self.sharded[row], self.grads_sharded[row], like=row)

    def _new_class(self, like: int) -> int:
        c = self.classes
        if c == len(self.size):
            per_class = (self.kept, self.loss, self.working, self.grads, self.shards)
            self.size, self.version, *grown = (
                _grown(a, 0) for a in (self.size, self.version, *per_class)
            )
            self.kept, self.loss, self.working, self.grads, self.shards = grown
            self.held, self.rep, self.grad = (
                _grown(a, 1) for a in (self.held, self.rep, self.grad)
            )
        for a in (self.kept, self.loss, self.working, self.grads, self.shards):
            a[c] = a[like]
        for m in (self.held, self.rep, self.grad):
            m[:, c] = m[:, like]
        self.classes += 1
        return c

    def _tile(self, run: _Run) -> list[int]:
        """The rows exactly covering ``run``'s layers, splitting or adding rows as needed."""
        tiles = self.tiles.setdefault(run.family, [])
        out: list[tuple[int, int, int]] = []
        pos = run.first
        rows_before = len(self.length)
        for first, end, row in tiles:
            if end <= pos or first >= run.end:
                out.append((first, end, row))
                continue
            if first < pos:  # split off the part before the run
                self.length[row] = pos - first
                out.append((first, pos, row))
                row = self._split_row(row, end - pos)
                first = pos
            if first > pos:  # a gap no slice held yet
                gap = self._new_row(first - pos, run.sharded, run.grads_sharded)
                out.append((pos, first, gap))
            if end > run.end:  # split off the part after the run
                self.length[row] = run.end - first
                out.append((first, run.end, row))
                out.append((run.end, end, self._split_row(row, end - run.end)))
            else:
                out.append((first, end, row))
            pos = min(end, run.end)
        if pos < run.end:
            out.append((pos, run.end, self._new_row(run.end - pos, run.sharded, run.grads_sharded)))
        out.sort()
        self.tiles[run.family] = out
        if len(self.length) != rows_before:  # every split or gap adds a row
            self.epoch[run.family] = self.epoch.get(run.family, 0) + 1
        return [row for first, end, row in out if first < run.end and end > run.first]

    def _stamp(self, s: _Slice) -> tuple[int, ...]:
        return tuple(self.epoch.get(run.family, 0) for run in s.runs)

    def _rows(self, s: _Slice) -> _Rows:
        """The rows a slice covers and what it holds of each, per layer (kept while its
        families' tilings stay as they are: placing a plan asks this several times a piece,
        and most pieces repeat a slice already tiled)."""
        kept = self.rows_of.get(id(s))
        if kept is not None and kept[0] == self._stamp(s):
            return kept[1]
        rows: list[int] = []
        runs: list[_Run] = []
        for run in s.runs:
            got = self._tile(run)
            rows.extend(got)
            runs.extend([run] * len(got))
        got = _Rows(
            np.array(rows, dtype=int),
            np.array([self.length[r] for r in rows], dtype=float),
            np.array([r.replicated for r in runs], dtype=float),
            np.array([self.sharded[r] for r in rows], dtype=float),
            np.array([r.grads for r in runs], dtype=float),
            np.array([self.grads_sharded[r] for r in rows], dtype=float),
        )
        self.rows_of[id(s)] = (self._stamp(s), got)
        return got

    def _gains(
        self, s: _Slice, n: int, classes: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What the slice on a group of ``n`` devices would add to each of ``classes`` (None:
        every class): state (weights, optimizer share), whole gradients and gradient shards
        (shares over the group: an upper bound, see the module docstring). Each is a sum over
        the slice's rows, weighted by their layer counts: matrix products over row x class."""
        k = self.classes
        if not s.runs:
            zero = np.zeros(k if classes is None else len(classes))
            return zero, zero, zero
        r = self._rows(s)
        cols = slice(0, k) if classes is None else classes
        rows = r.idx if classes is None else r.idx[:, None]
        free = ~self.held[rows, cols]
        w = r.lengths
        shares = np.stack((w * r.sharded, w * r.grads_sharded)) / n @ free
        state = w @ np.maximum(0.0, r.rep[:, None] - self.rep[rows, cols]) + shares[0]
        grads = w @ np.maximum(0.0, r.grads[:, None] - self.grad[rows, cols])
        return state, grads, shares[1]

    def need(self, piece: Piece) -> np.ndarray:
        s = self._slice(piece)
        k = self.classes
        state, grads, shards = self._gains(s, piece.n)
        self.priced[(id(s), piece.n)] = (self.version[:k].copy(), grads, shards)
        forward = self.kept[:k] + self.loss[:k]
        before = self.life.peak(forward, self.grads[:k], self.shards[:k]) + self.working[:k]
        after = self.life.peak(
            forward + s.kept + s.loss, self.grads[:k] + grads, self.shards[:k] + shards
        ) + np.maximum(self.working[:k], s.working)
        return (state + after - before)[self.cls]

    def _whole_classes(self, ds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Split classes so that ``ds`` is a union of whole classes: the classes ``ds`` was in
        and, in the same order, the whole classes each part of it is now in."""
        of = self.cls[ds]
        if not len(of):
            return of, of
        order = np.argsort(of, kind="stable")
        ranked = of[order]  # sorted already: runs of equal classes (np.unique would sort again)
        edge = np.empty(len(ranked), dtype=bool)
        edge[0] = True
        np.not_equal(ranked[1:], ranked[:-1], out=edge[1:])
        start = np.flatnonzero(edge)
        uniq = ranked[start]
        count = np.diff(np.append(start, len(ranked)))
        out = uniq.copy()
        for i in np.nonzero(count < self.size[uniq])[0]:
            c = int(uniq[i])
            members = ds[order[start[i] : start[i] + count[i]]]
            new = self._new_class(c)
            self.cls[members] = new
            self.size[c] -= len(members)
            self.size[new] = len(members)
            out[i] = new
        return uniq, out

    def _priced(
        self, s: _Slice, n: int, was: np.ndarray, now: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The whole gradients and gradient shards the slice adds to classes ``now`` (split
        from ``was``): as ``need`` priced them where no piece has added to those classes
        since (a split class holds what its origin held), else priced again."""
        # (taken out, not kept: at 65,536 devices a placement prices thousands of slices,
        # each over thousands of classes)
        got = self.priced.pop((id(s), n), None)
        if got is not None:
            stamp, grads, shards = got
            if was.max() < len(stamp) and np.array_equal(stamp[was], self.version[was]):
                return grads[was], shards[was]
        return self._gains(s, n, now)[1:]

    def add(self, piece: Piece, devices: Iterable[int], need: np.ndarray) -> None:
        s = self._slice(piece)
        ds = np.asarray(devices if isinstance(devices, np.ndarray) else list(devices), dtype=int)
        if not len(ds):
            return
        was, cl = self._whole_classes(ds)
        self.kept[cl] += s.kept
        self.loss[cl] += s.loss
        self.working[cl] = np.maximum(self.working[cl], s.working)
        self.kept_log.append((piece.op, ds, s.kept))
        if s.runs:
            grads, shards = self._priced(s, len(ds), was, cl)
            self.version[cl] += 1
            self.grads[cl] += grads
            self.shards[cl] += shards
            r = self._rows(s)
            grid = (r.idx[:, None], cl)
            self.rep[grid] = np.maximum(self.rep[grid], r.rep[:, None])
            self.grad[grid] = np.maximum(self.grad[grid], r.grads[:, None])
            self.held[grid] = True

    def spread_loss(
        self, op: str, layers: int, last: Iterable[int], group: Iterable[int], share: float
    ) -> None:
        """Move lm sink ``op``'s loss tensors from the devices of its last piece (``last``,
        added already) to its loss group (``planner.evaluate.relabel``), each device of which
        holds them for at most ``share`` of the pass's batch (``cost.step.spread_share``):
        the runtime scores a spread loss data-parallel, so the whole batch's tensors (on one
        device) scale by the share. The last piece's working set (the logits, if they were
        its largest) stays charged: a peak can only be overstated by it."""
        old = np.asarray(list(last), dtype=int)
        new = np.asarray(list(group), dtype=int)
        before = self.fn(op, len(old), layers - 1, layers)
        whole = self.fn(op, 1, layers - 1, layers)
        cl = self._whole_classes(old)[1]
        self.loss[cl] -= before.loss
        cg = self._whole_classes(new)[1]
        self.loss[cg] += whole.loss * share
        self.working[cg] = np.maximum(self.working[cg], whole.working * share)

    def _held(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(layers per row, held row x class, holders per row) over the rows so far."""
        rows, k = len(self.length), self.classes
        held = self.held[:rows, :k]
        holders = np.maximum((held * self.size[:k]).sum(axis=1), 1)
        return np.array(self.length, dtype=float)[:, None], held, holders

    def _state(self) -> np.ndarray:
        """Parameter bytes per class: each row's replicated bytes where held, and its share of
        the optimizer state, split over every device holding it."""
        lengths, held, holders = self._held()
        share = (np.array(self.sharded, dtype=float) / holders)[:, None]
        return (lengths * (self.rep[: len(self.length), : self.classes] + held * share)).sum(axis=0)

    def _alive(self) -> tuple[np.ndarray, np.ndarray]:
        """Per class, what the peak holds beyond parameter state and working set (kept
        activations, loss tensors and the gradients alive then), and the gradients' part of
        it, with every gradient shard split over its row's final holders."""
        lengths, held, holders = self._held()
        k = self.classes
        grads = (lengths * self.grad[: len(self.length), :k]).sum(axis=0)
        share = (np.array(self.grads_sharded, dtype=float) / holders)[:, None]
        shards = (lengths * held * share).sum(axis=0)
        forward = self.kept[:k] + self.loss[:k]
        peak = self.life.peak(forward, grads, shards)
        return peak, peak - forward

    def memory(self) -> tuple[int, ...]:
        total = self._alive()[0] + self.working[: self.classes] + self._state()
        per_class = [int(x) for x in np.ceil(total)]  # Python ints: no int64 to overflow
        return tuple(map(per_class.__getitem__, self.cls.tolist()))

    def breakdown(self, device: int) -> DeviceBreakdown:
        kept: dict[str, int] = {}
        for op, ds, nbytes in self.kept_log:
            if device in ds:
                kept[op] = kept.get(op, 0) + nbytes
        c = int(self.cls[device])
        gradients = self._alive()[1]
        return DeviceBreakdown(
            kept,
            int(self._state()[c]),
            int(self.working[c]),
            int(self.loss[c]),
            int(gradients[c]),
        )


def _grown(a: np.ndarray, axis: int) -> np.ndarray:
    """``a`` twice as long along ``axis``, zero-filled."""
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, a.shape[axis])
    return np.pad(a, pad)
