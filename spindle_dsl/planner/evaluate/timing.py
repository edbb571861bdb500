"""Predicted iteration time of a placed schedule: waves, activation transfers, gradient sync.

* Compute: the waves run back to back; each lasts as long as its longest piece.
* Transfers: when a MetaOp's next layers run on other devices, or a consumer starts on
  devices other than its producer's, the activations move (and, with a backward pass, their
  gradients move back). Moves into the same wave happen together at the wave boundary; moves
  touching disjoint devices run in parallel, those sharing a device queue up, so a boundary
  costs its busiest device's total (forward and backward boundaries counted separately).
* Gradient sync: a module shared by several MetaOps must sum its gradients over every device
  that holds one of its layers (see ``grad_sync_seconds`` for what is already in T_m(n)),
  queued per device as above.

With a step model (``cost.step.StepModel``, which both built-in cost models give), the
iteration is the runtime's whole step instead: the waves with CPU cores shared, the input
stages and per-stage costs of each wave, the loss phase, the gradient reduction as the runtime
issues it (unless the curves already carry it) and the optimizer, over ``micro_batches``
passes; ``Timing`` holds each term and ``iteration_s`` is their sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from spindle_dsl.cost.overheads import BUCKET_BYTES
from spindle_dsl.cost.step import (
    BackwardClock,
    PieceTime,
    StepModel,
    WaveMoves,
    reductions_per_step,
)
from spindle_dsl.planner.evaluate.placement import PlacedPiece, Placement

TransferFn = Callable[[float, Sequence[int], Sequence[int]], float]
AllreduceFn = Callable[[float, Sequence[int]], float]


@dataclass(frozen=True)
class SharedModule:
    """A module whose layers several MetaOps run: ``(op id, first layer within op)``."""

    name: str
    layers: int
    bytes_per_layer: float
    holders: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Flows:
    """The data a plan moves, read off the MetaGraph once."""

    carry_bytes: dict[str, float]  # activations between two layers of an op (whole batch)
    backward: dict[str, bool]  # whether an op runs a backward pass
    edges: tuple[tuple[str, str, float], ...]  # (producer, consumer, bytes of the whole batch)
    shared: tuple[SharedModule, ...]


@dataclass(frozen=True)
class Timing:
    """An iteration's time by term (each over all its micro-batch passes); ``durations`` and
    ``wave_extra`` are one pass's waves."""

    compute_s: float
    transfer_s: float
    grad_sync_s: float
    durations: tuple[float, ...]
    wave_overhead_s: float = 0.0
    loss_s: float = 0.0
    optimizer_s: float = 0.0
    wave_extra: tuple[float, ...] = ()
    entry_extra: tuple[tuple[float, ...], ...] = ()
    wave_transfer: tuple[float, ...] = ()  # per wave: its moves not hidden by compute (one pass)
    stepped: bool = False  # priced by a step model (the breakdown then has every term)

    @property
    def iteration_s(self) -> float:
        return (
            self.compute_s
            + self.transfer_s
            + self.grad_sync_s
            + self.wave_overhead_s
            + self.loss_s
            + self.optimizer_s
        )

    def breakdown(self) -> tuple[tuple[str, float], ...]:
        """The plan's ``breakdown``: the three classic terms, and the step model's when set."""
        terms = [
            ("compute_s", self.compute_s),
            ("transfer_s", self.transfer_s),
            ("grad_sync_s", self.grad_sync_s),
        ]
        if self.stepped:
            terms += [
                ("wave_overhead_s", self.wave_overhead_s),
                ("loss_s", self.loss_s),
                ("optimizer_s", self.optimizer_s),
            ]
        return tuple(terms)


class _Load:
    """Seconds charged to devices, summed per device when the busiest is asked for. Charges
    are kept as arrays and summed in one pass, in the order they came (so each device's sum
    is the same float a running total gives), never device by device in Python."""

    def __init__(self) -> None:
        self.charges: list[tuple[np.ndarray, float]] = []

    def charge(self, devices: np.ndarray, seconds: float) -> None:
        self.charges.append((devices, seconds))

    def busiest(self) -> float:
        if not self.charges:
            return 0.0
        return float(self.sums().max())

    def sums(self, devices: int = 0) -> np.ndarray:
        """Each device's sum, by device id (at least ``devices`` long)."""
        if not self.charges:
            return np.zeros(devices)
        ids = np.concatenate([d for d, _ in self.charges])
        weights = np.concatenate([np.full(len(d), s) for d, s in self.charges])
        return np.bincount(ids, weights=weights, minlength=devices)


def _ids(devices: Sequence[int]) -> np.ndarray:
    return np.asarray(devices, dtype=int)


def _same(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return a == b


def time_placement(
    placement: Placement,
    seconds: Callable[[str, int], float],
    flows: Flows,
    transfer: TransferFn,
    allreduce: AllreduceFn,
    step: StepModel | None = None,
    *,
    micro_batches: int = 1,
    zero_stage: int = 1,
) -> Timing:
    """Iteration time of ``placement``; ``seconds(op, n)`` is T_op(n) per layer of one pass
    and ``flows`` the data one pass moves. The waves run ``micro_batches`` times: compute and
    transfers count that often (``durations`` stay one pass's); the gradients are reduced as
    the runtime does under ``zero_stage`` (``cost.step.reductions_per_step``). With a ``step``
    model, the runtime's whole step (module docstring)."""
    k = max(1, micro_batches)
    if step is not None:
        return _time_step(placement, seconds, flows, transfer, allreduce, step, k, zero_stage)
    durations = tuple(
        max((p.layers * seconds(p.op, p.n) for p in w), default=0.0) for w in placement.waves
    )
    return Timing(
        k * sum(durations),
        k * boundary_moves_s(placement, flows, transfer),
        reductions_per_step(k, zero_stage) * grad_sync_seconds(placement, flows, allreduce),
        durations,
    )


def _time_step(
    placement: Placement,
    seconds: Callable[[str, int], float],
    flows: Flows,
    transfer: TransferFn,
    allreduce: AllreduceFn,
    step: StepModel,
    k: int,
    zero_stage: int,
) -> Timing:
    waves = [
        [PieceTime(p.op, p.first, p.end, p.devices, p.layers * seconds(p.op, p.n)) for p in w]
        for w in placement.waves
    ]
    groups = dict(placement.loss_groups)
    price = step.price(
        waves,
        micro_batches=k,
        zero_stage=zero_stage,
        moves=_wave_moves(placement, flows, transfer),
        loss_groups=groups,
        loss_moves=loss_moves(placement, step, flows, transfer, k) if groups else None,
    )
    if step.grad_in_curves:
        # each layer's own all-reduce is in the pass curves at its per-pass share
        # (``planner.model.levers``); what shared modules add is reduced as often as the stage says
        clock = price.backward_clock() if step.overlaps_reduction else None
        reduction = grad_sync_seconds(
            placement,
            flows,
            allreduce,
            clock,
            reductions_per_step(k, zero_stage),
            lambda op, n: seconds(op, n) * step.ops[op].backward_share,
            step.overheads.bucket_bytes,
        )
    else:
        reduction = price.grad_sync_s
    return Timing(
        compute_s=k * sum(price.durations),
        transfer_s=k * sum(price.wave_transfer),
        grad_sync_s=reduction + price.closing_s,
        durations=price.durations,
        wave_overhead_s=k * sum(price.wave_extra),
        loss_s=k * price.loss_s,
        optimizer_s=price.optimizer_s,
        wave_extra=price.wave_extra,
        entry_extra=price.entry_extra,
        wave_transfer=price.wave_transfer,
        stepped=True,
    )


def loss_moves(
    placement: Placement, step: StepModel, flows: Flows, transfer: TransferFn, k: int
) -> dict[int, float]:
    """Seconds per device of one pass's spread-loss moves (``Placement.loss_groups``): each
    spread sink's head inputs from its last piece to its loss group and, with a backward
    pass, their gradients back, charged to the devices of both (as a wave's moves are)."""
    groups = dict(placement.loss_groups)
    last: dict[str, PlacedPiece] = {}
    for wave in placement.waves:
        for p in wave:
            last[p.op] = p
    out: dict[int, float] = {}
    for s in step.sinks:
        group, p = groups.get(s.sink), last.get(s.sink)
        if not group or p is None or s.loss != "lm" or s.hidden_bytes <= 0:
            continue
        batch = step.ops[s.sink].batch
        nbytes = -(-batch // k) * s.hidden_bytes  # one micro-batch's rows
        secs = transfer(nbytes, p.devices, group)
        if flows.backward.get(s.sink, True):
            secs += transfer(nbytes, group, p.devices)
        for d in {*p.devices, *group}:
            out[d] = out.get(d, 0.0) + secs
    return out


def boundary_moves_s(placement: Placement, flows: Flows, transfer: TransferFn) -> float:
    """One pass's activation moves, every wave boundary at its busiest device (forward and
    backward), none of them hidden behind a stage."""
    return sum(m.busiest_s for m in _wave_moves(placement, flows, transfer))


def _wave_moves(placement: Placement, flows: Flows, transfer: TransferFn) -> tuple[WaveMoves, ...]:
    """Per wave, the activation moves into it and their gradients back out (module
    docstring), of one micro-batch pass (``flows`` are one pass's): each move is charged to
    the devices of both groups (a sender waits for its sends as a receiver for its receives)."""
    last: dict[str, PlacedPiece] = {}
    fwd = [_Load() for _ in placement.waves]
    bwd = [_Load() for _ in placement.waves]
    consumers: dict[str, list[tuple[str, float]]] = {}
    for src, dst, nbytes in flows.edges:
        consumers.setdefault(dst, []).append((src, nbytes))
    for wi, wave in enumerate(placement.waves):
        for p in wave:
            moves: list[tuple[PlacedPiece, float, bool]] = []
            if p.op in last:
                moves.append((last[p.op], flows.carry_bytes[p.op], flows.backward[p.op]))
            else:
                for src, nbytes in consumers.get(p.op, []):
                    if src in last:
                        moves.append((last[src], nbytes, flows.backward[src]))
            for q, nbytes, back in moves:
                if _same(q.devices, p.devices):
                    continue
                both = np.union1d(q.ids, p.ids)  # a device in both groups waits once
                fwd[wi].charge(both, transfer(nbytes, q.devices, p.devices))
                if back:
                    bwd[wi].charge(both, transfer(nbytes, p.devices, q.devices))
        for p in wave:
            last[p.op] = p
    return tuple(
        _moves_of(wave, f, b) for wave, f, b in zip(placement.waves, fwd, bwd, strict=True)
    )


def _moves_of(wave: Sequence[PlacedPiece], fwd: _Load, bwd: _Load) -> WaveMoves:
    """A wave's moves as the step model weighs them against its pieces (``WaveMoves``)."""
    if not fwd.charges and not bwd.charges:
        return WaveMoves(0.0, (0.0,) * len(wave), 0.0)
    charged = [d for d, _ in fwd.charges + bwd.charges] + [p.ids for p in wave]
    size = 1 + max(int(d.max()) for d in charged if len(d))
    f, b = fwd.sums(size), bwd.sums(size)  # each summed once: the busiest read off them
    both = f + b
    per_piece = tuple(float(both[p.ids].max()) if p.devices else 0.0 for p in wave)
    return WaveMoves(float(f.max() + b.max()), per_piece, float(both.max()))


def grad_sync_seconds(
    placement: Placement,
    flows: Flows,
    allreduce: AllreduceFn,
    backward: BackwardClock | None = None,
    scale: float = 1.0,
    layer_backward: Callable[[str, int], float] | None = None,
    bucket_bytes: float = BUCKET_BYTES,
) -> float:
    """What summing shared modules' gradients over their holders costs beyond T_m(n), and,
    given the ``backward`` pass's clock, the part of it the backward does not hide.

    The runtime accumulates a shared layer's gradient locally over every MetaOp a device ran
    it for, then all-reduces it once over all its holders (the union U of the groups S_i of
    the MetaOps holding it). Each MetaOp's curve already paid an all-reduce over its own S_i,
    so the extra is AR(U) - sum_i AR(S_i), never counted below zero: nothing when every
    MetaOp ran the layer on the same devices, an inter-node all-reduce when intra-node
    groups of different tasks share a layer across nodes. ``scale`` multiplies each (the
    reductions a step makes, ``cost.step.reductions_per_step``).

    Without a clock, every device's extras run after the waves, one after another: the
    busiest device's sum. With one, as the runtime issues its asynchronous buckets: a layer's
    reduction is ready when the last of its holders' backward of it ends (backward runs the
    waves in reverse, so in the backward of the earliest wave holding it); each device runs
    its reductions one after another in the order they become ready, under the backward still
    to come, and only what ends past the end of the backward counts. When is that inside the
    wave? With ``layer_backward(op, n)`` (one layer's backward, seconds), layer by layer, as
    the runtime issues a bucket from the accumulation hook of its last gradient
    (``backends/torch/grads.py``): a piece's backward starts with its wave's and finishes its
    last layer first, so layer g of a piece ``[first, end)`` is done ``(end - g)`` layers in;
    the layers go into buckets of at most ``bucket_bytes`` in that order (the step model's
    figure, as its own buckets), each ready with its
    last layer, and a run's extra is spread over its buckets by their bytes. Without it, at
    the end of that wave's backward (a stage's gradients issued when the stage ends).
    """
    groups, inside = _shared_runs(placement, flows, backward, layer_backward, bucket_bytes)
    load = _Load()
    jobs: list[list[tuple[float, float]]] = []  # per group: (ready s, seconds) of its buckets
    member: dict[int, list[int]] = {}  # device -> the groups it is in
    for key, nbytes in groups.items():
        sets, ready = key
        union = tuple(sorted(set().union(*sets)))
        extra = scale * (allreduce(nbytes, union) - sum(allreduce(nbytes, s) for s in sets))
        if extra <= 0:
            continue
        if backward is None:
            load.charge(_ids(union), extra)
            continue
        buckets = inside.get(key) or [(backward.ready_s(ready), nbytes)]
        jobs.append([(at, extra * b / nbytes) for at, b in buckets])
        for d in union:
            member.setdefault(d, []).append(len(jobs) - 1)
    if backward is None:
        return load.busiest()
    worst = 0.0
    for mine in {tuple(g) for g in member.values()}:  # devices in the same groups queue alike
        clock = 0.0
        for at, secs in sorted(j for g in mine for j in jobs[g]):
            clock = max(clock, at) + secs
        worst = max(worst, clock - backward.total_s)
    return max(worst, 0.0)


Holders = tuple[tuple[int, ...], ...]  # the device sets of a shared run's holders


def _shared_runs(
    placement: Placement,
    flows: Flows,
    backward: BackwardClock | None,
    layer_backward: Callable[[str, int], float] | None,
    bucket_bytes: float,
) -> tuple[dict[tuple[Holders, int], float], dict[tuple[Holders, int], list[tuple[float, float]]]]:
    """The shared modules' layers whose holders run them on different device sets, grouped
    by those sets and the wave in whose backward they are ready (0 without a clock): per
    group its bytes, and (with ``layer_backward``) its buckets inside the wave, each as
    (seconds from the backward's start, bytes); see ``grad_sync_seconds``."""
    where: dict[str, list[tuple[int, int, tuple[int, ...], int]]] = {}
    for wi, wave in enumerate(placement.waves):
        for p in wave:
            where.setdefault(p.op, []).append((p.first, p.end, tuple(sorted(p.devices)), wi))
    groups: dict[tuple[Holders, int], float] = {}  # (sets, ready wave)
    # per group, its buckets inside the wave: (seconds from the backward's start, bytes)
    inside: dict[tuple[Holders, int], list[tuple[float, float]]] = {}
    by_layer = backward is not None and layer_backward is not None
    for mod in flows.shared:
        # the module's layers split into runs at every piece boundary of every holder: within
        # a run each holder runs every layer on the same devices (no loop over layers)
        cuts = {0, mod.layers}
        for op, offset in mod.holders:
            for first, end, _, _ in where.get(op, []):
                cuts.update(min(max(x - offset, 0), mod.layers) for x in (first, end))
        bounds = sorted(cuts)
        for lo, hi in pairwise(bounds):
            sets = []
            ready = len(placement.waves)
            pieces = []  # (op, offset, end, n, wave) of each holder's piece with the run
            for op, offset in mod.holders:
                layer = offset + lo
                for first, end, devs, wi in where.get(op, []):
                    if first <= layer < end:
                        sets.append(devs)
                        ready = min(ready, wi)
                        pieces.append((op, offset, end, len(devs), wi))
                        break
            if len(set(sets)) > 1:
                key = (tuple(sorted(sets)), ready if backward is not None else 0)
                groups[key] = groups.get(key, 0.0) + (hi - lo) * mod.bytes_per_layer
                if by_layer:
                    inside.setdefault(key, []).extend(
                        _run_buckets(
                            (lo, hi),
                            mod.bytes_per_layer,
                            pieces,
                            backward,
                            layer_backward,
                            bucket_bytes,
                        )
                    )
    return groups, inside


def _run_buckets(
    run: tuple[int, int],
    bytes_per_layer: float,
    pieces: Sequence[tuple[str, int, int, int, int]],
    backward: BackwardClock,
    layer_backward: Callable[[str, int], float],
    bucket_bytes: float,
) -> list[tuple[float, float]]:
    """A run's layers ``[lo, hi)`` (``run``) of a shared module as the runtime buckets them
    during the backward: (when the bucket is ready, seconds from the backward's start; its
    bytes). Layer l is done on a holder's piece (op, offset, end, n, wave) ``end - (offset +
    l)`` layers into that wave's backward, and ready once every holder is done; later layers
    first, a bucket closing before it would pass ``bucket_bytes`` (as
    ``backends/torch/shards``)."""
    lo, hi = run
    # the backward of the earliest wave holding the run ends last: every layer is ready then
    last = backward.ready_s(min(wave for *_, wave in pieces))
    # per holder's piece: when its wave's backward starts, the layer its piece ends at, and one
    # layer's backward
    starts = [
        (backward.start_s(wave), end - offset, layer_backward(op, n))
        for op, offset, end, n, wave in pieces
    ]
    out: list[tuple[float, float]] = []
    size, at = 0.0, 0.0
    for layer in range(hi - 1, lo - 1, -1):
        done = max(start + (stop - layer) * each for start, stop, each in starts)
        if size and size + bytes_per_layer > bucket_bytes:
            out.append((at, size))
            size = 0.0
        size += bytes_per_layer
        at = min(done, last)
    out.append((at, size))
    return out
