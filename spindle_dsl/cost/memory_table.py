"""``SliceMemory.alone(n)`` for every n at once, for the planner's per-allocation fit check.

The planner asks, for every MetaOp and every allocation n, whether one layer fits on n
devices (thousands of allocations on a large cluster). Pricing each through ``slice_memory``
builds the same parts over and over; this computes the same integers with numpy over arrays
of the data- and tensor-parallel degrees the cost model picks for each n. It must agree with
``memory.slice_memory(...).alone(n)`` exactly (the tests compare them).
"""

from __future__ import annotations

import numpy as np

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost.memory import (
    OpMemoryInfo,
    dtype_bytes,
    grad_in_flight,
    layer_parts,
    staged,
)
from spindle_dsl.metagraph import MetaOp


def alone_bytes(
    info: OpMemoryInfo,
    op: MetaOp,
    first: int,
    end: int,
    dp: np.ndarray,
    tp: np.ndarray,
    recompute: bool,
    cluster: Cluster,
    zero_stage: int = 1,
) -> tuple[int, ...]:
    """Peak bytes per device of layers ``[first, end)`` alone on ``n = 1..len(dp)`` devices,
    where n runs as ``dp[n - 1]`` replicas of ``tp[n - 1]``-way layers, parameter state laid
    out for ``zero_stage``."""
    n = np.arange(1, len(dp) + 1, dtype=np.int64)
    dp, tp = np.asarray(dp, dtype=np.int64), np.asarray(tp, dtype=np.int64)
    state = np.zeros(len(n), dtype=np.int64)
    in_flight = np.zeros(len(n), dtype=np.int64)
    edges = [staged(p, zero_stage) for p in (info.inputs if first == 0 else ())]
    if end == op.layers and info.head is not None:
        edges.append(staged(info.head, zero_stage))
    for degree in np.unique(tp):  # a layer part's bytes depend on the TP degree
        at = tp == degree
        parts = [*layer_parts(op, first, end, int(degree), cluster, zero_stage), *edges]
        state[at] += sum(p.replicated for p in parts)
        for p in parts:
            state[at] += -(-p.sharded // n[at])
        in_flight[at] = grad_in_flight(parts, cluster, zero_stage)
    kept = np.zeros(len(n), dtype=np.int64)
    working = np.zeros(len(n), dtype=np.int64)
    layers = end - first
    if layers > 0 and op.batch > 0:
        rows = -(-op.batch // dp)
        per_device = rows * dtype_bytes(cluster) / tp
        full = np.trunc(info.activations * per_device).astype(np.int64)
        if not op.needs_backward:
            working = full
        elif recompute:
            kept = np.trunc(info.layer_input * per_device * layers).astype(np.int64)
            working = full
        else:
            kept = np.trunc(info.activations * per_device * layers).astype(np.int64)
    if end == op.layers and info.text_tokens >= 2 and op.batch > 0:
        head_rows = -(-op.batch // dp) * (info.text_tokens - 1) * dtype_bytes(cluster)
        if op.needs_backward:
            kept = kept + head_rows * (info.vocab + 2 * op.out_width)
        working = np.maximum(working, head_rows * info.vocab)
    return tuple(int(x) for x in state + kept + working + in_flight)
