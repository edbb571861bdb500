"""``SliceMemory.alone(n)`` for many allocations at once, for the planner's fit check.

The planner asks, for every MetaOp and every allocation its curve lists, whether one layer
fits on n devices. Pricing each through ``slice_memory`` builds the same parts over and over;
this reads the parts once per tensor-parallel degree and prices every allocation from their
sums. Figures are Python integers, exact at any magnitude the language allows (no int64 to
overflow, no float to round), and must agree with ``memory.slice_memory(...).alone(n)``
exactly (the tests compare them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost.base import PartBytes
from spindle_dsl.cost.memory import (
    OpMemoryInfo,
    dtype_bytes,
    gradient_life,
    layer_parts,
    staged,
    tp_activation_share,
)
from spindle_dsl.metagraph import MetaOp


def alone_bytes(
    info: OpMemoryInfo,
    op: MetaOp,
    first: int,
    end: int,
    configs: Sequence[tuple[int, int, int]],
    recompute: bool,
    cluster: Cluster,
    zero_stage: int = 1,
    micro_batches: int = 1,
) -> tuple[int, ...]:
    """Peak bytes per device of layers ``[first, end)`` alone on each ``(n, dp, tp)`` of
    ``configs``: n devices running ``dp`` replicas of ``tp``-way layers, parameter state laid
    out for ``zero_stage``, gradients alive as ``micro_batches`` passes keep them."""
    edges: list[PartBytes] = [staged(p, zero_stage) for p in (info.inputs if first == 0 else ())]
    if end == op.layers:
        edges.extend(staged(p, zero_stage) for p in info.last_layer_parts(first))
    by_tp: dict[int, _Sums] = {}
    life = gradient_life(cluster, micro_batches, zero_stage)
    layers = end - first
    dt = dtype_bytes(cluster)
    text = info.text_tokens if end == op.layers and op.batch > 0 else 0
    out = []
    for n, dp, tp in configs:
        sums = by_tp.get(tp)
        if sums is None:
            sums = by_tp[tp] = _sums(layer_parts(op, first, end, tp, cluster, zero_stage) + edges)
        state = sums.replicated + _shares(sums.sharded, n)
        grads = sums.grads
        shards = _shares(sums.grads_sharded, n)
        kept = working = loss = 0
        rows = -(-op.batch // dp)
        if layers > 0 and op.batch > 0:
            per_device = rows * dt
            full = info.activations * per_device * tp_activation_share(tp)
            if not op.needs_backward:
                working = int(full)
            elif recompute:  # a layer's input is whole on every rank of the group
                kept = int(info.layer_input * per_device * layers)
                working = int(full)
            else:
                kept = int(full * layers)
        if text >= 2:
            head_rows = rows * (text - 1) * dt
            if op.needs_backward:
                loss = head_rows * (info.vocab + 2 * op.out_width)
            working = max(working, head_rows * info.vocab)
        out.append(state + int(life.peak(kept + loss, grads, shards)) + working)
    return tuple(out)


@dataclass(frozen=True)
class _Sums:
    """What ``PartBytes.on``, ``grads`` and ``grad_share`` add up to over a slice's parts,
    read once per tensor-parallel degree: the sums that do not depend on n, and for those
    that do, each part's (layer bytes, layers) to split per layer over n as ``_share``
    does."""

    replicated: int
    grads: int
    sharded: tuple[tuple[int, int], ...]
    grads_sharded: tuple[tuple[int, int], ...]


def _sums(parts: Sequence[PartBytes]) -> _Sums:
    return _Sums(
        sum(p.replicated for p in parts),
        sum(p.grads for p in parts),
        tuple((p.sharded // p.count, p.count) for p in parts),
        tuple((p.grads_sharded // p.count, p.count) for p in parts),
    )


def _shares(per_layer: tuple[tuple[int, int], ...], n: int) -> int:
    """Sum over parts of ``count * ceil(layer bytes / n)`` (``cost.base._share``)."""
    m = max(n, 1)
    return sum(count * -(-each // m) for each, count in per_layer)
