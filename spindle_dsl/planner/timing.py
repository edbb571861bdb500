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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spindle_dsl.planner.placement import Placement

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
    compute_s: float
    transfer_s: float
    grad_sync_s: float
    durations: tuple[float, ...]

    @property
    def iteration_s(self) -> float:
        return self.compute_s + self.transfer_s + self.grad_sync_s


def _charge(load: dict[int, float], devices: Sequence[int], seconds: float) -> None:
    for d in devices:
        load[d] = load.get(d, 0.0) + seconds


def time_placement(
    placement: Placement,
    seconds: Callable[[str, int], float],
    flows: Flows,
    transfer: TransferFn,
    allreduce: AllreduceFn,
    passes: int = 1,
    reductions: float = 1.0,
) -> Timing:
    """Iteration time of ``placement``; ``seconds(op, n)`` is T_op(n) per layer.

    With micro-batches the waves run ``passes`` times (``seconds`` and ``flows`` describe one
    pass): compute and transfers count that often, ``durations`` stay one pass's. Gradients
    are reduced ``reductions`` all-reduces' worth per iteration (1, or (k + 1) / 2 when ZeRO-2
    reduce-scatters every pass; see ``planner.levers``)."""
    durations = tuple(
        max((p.layers * seconds(p.op, p.n) for p in w), default=0.0) for w in placement.waves
    )
    last: dict[str, tuple[int, ...]] = {}
    fwd: list[dict[int, float]] = [{} for _ in placement.waves]
    bwd: list[dict[int, float]] = [{} for _ in placement.waves]
    consumers: dict[str, list[tuple[str, float]]] = {}
    for src, dst, nbytes in flows.edges:
        consumers.setdefault(dst, []).append((src, nbytes))
    for wi, wave in enumerate(placement.waves):
        for p in wave:
            moves: list[tuple[tuple[int, ...], float, bool]] = []
            if p.op in last:
                moves.append((last[p.op], flows.carry_bytes[p.op], flows.backward[p.op]))
            else:
                for src, nbytes in consumers.get(p.op, []):
                    if src in last:
                        moves.append((last[src], nbytes, flows.backward[src]))
            for src_devs, nbytes, back in moves:
                if set(src_devs) == set(p.devices):
                    continue
                t = transfer(nbytes, src_devs, p.devices)
                _charge(fwd[wi], (*src_devs, *p.devices), t)
                if back:
                    t_back = transfer(nbytes, p.devices, src_devs)
                    _charge(bwd[wi], (*src_devs, *p.devices), t_back)
        for p in wave:
            last[p.op] = p.devices
    transfer_s = sum(max(x.values(), default=0.0) for x in fwd) + sum(
        max(x.values(), default=0.0) for x in bwd
    )
    return Timing(
        passes * sum(durations),
        passes * transfer_s,
        reductions * grad_sync_seconds(placement, flows, allreduce),
        durations,
    )


def grad_sync_seconds(placement: Placement, flows: Flows, allreduce: AllreduceFn) -> float:
    """What summing shared modules' gradients over their holders costs beyond T_m(n).

    The runtime accumulates a shared layer's gradient locally over every MetaOp a device ran
    it for, then all-reduces it once over all its holders (the union U of the groups S_i of
    the MetaOps holding it). Each MetaOp's curve already paid an all-reduce over its own S_i,
    so the extra is AR(U) - sum_i AR(S_i), never counted below zero: nothing when every
    MetaOp ran the layer on the same devices, an inter-node all-reduce when intra-node
    groups of different tasks share a layer across nodes.
    """
    where: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {}
    for wave in placement.waves:
        for p in wave:
            where.setdefault(p.op, []).append((p.first, p.end, p.devices))
    load: dict[int, float] = {}
    for mod in flows.shared:
        groups: dict[tuple[tuple[int, ...], ...], int] = {}  # holder groups -> layers
        for j in range(mod.layers):
            sets = []
            for op, offset in mod.holders:
                layer = offset + j
                for first, end, devs in where.get(op, []):
                    if first <= layer < end:
                        sets.append(tuple(sorted(devs)))
                        break
            if len(set(sets)) > 1:
                key = tuple(sorted(sets))
                groups[key] = groups.get(key, 0) + 1
        for sets, count in groups.items():
            nbytes = count * mod.bytes_per_layer
            union = tuple(sorted(set().union(*sets)))
            extra = allreduce(nbytes, union) - sum(allreduce(nbytes, s) for s in sets)
            if extra > 0:
                _charge(load, union, extra)
    return max(load.values(), default=0.0)
