"""The analytic cost model: T_m(n) from FLOPs, datasheet peaks and link bandwidths.

T_m(n) is the fastest way of running one layer of a MetaOp on n devices, of these:
- data parallelism over ``dp`` replicas: the batch is split as evenly as possible and the
  largest shard (``ceil(batch / dp)``) sets the time, so no n is ever forbidden;
- tensor parallelism of degree ``tp`` inside one node (``tp`` divides the heads, or the output
  width of an mlp, and ``n``), paying its activation all-reduces (Megatron-style);
- using fewer than n devices and leaving the rest idle, which is always possible, so T_m(n)
  never rises with n.
Only the configurations that can be fastest are priced, and the curve lists the allocations
that matter rather than every n (``cost.allocations``).
Compute time is a fixed per-layer overhead plus the per-device FLOPs at an efficiency that
falls as per-device work shrinks (``eff(w) = max_eff * w / (w + half_work)``, never above 1,
so T(n) >= FLOPs / (n * peak) always holds). A trainable layer adds the ring all-reduce of its
gradients over the data-parallel group (NVLink inside a node, the network across nodes),
counted in full (no overlap with backward assumed). The efficiency figures are assumptions;
``spindle profile`` replaces the compute part with measurements.

A MetaOp that recomputes its activations (full per-layer checkpointing) runs each layer's
forward twice: one more forward's FLOPs (fwd+bwd = 4x forward instead of 3x when training, 3x
instead of 2x when only input gradients flow) and, under tensor parallelism, one more round of
the forward's activation all-reduces. Memory is priced in ``cost.memory``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost import comm
from spindle_dsl.cost.allocations import StepCurve, curve_of, listed, shard_breakpoints
from spindle_dsl.cost.base import Curves, SliceMemory
from spindle_dsl.cost.memory import (
    MemoryInfoCache,
    dtype_bytes,
    slice_memory,
    slice_memory_bytes,
)
from spindle_dsl.cost.memory_table import alone_bytes
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph, MetaOp


@dataclass(frozen=True)
class DeviceModel:
    """How far below its peak a device runs one layer (assumed figures, see the docstring)."""

    max_efficiency: float  # fraction of peak a large layer reaches
    half_work_flops: float  # per-device FLOPs at which a layer reaches half of max_efficiency
    layer_overhead_s: float  # fixed seconds per layer forward+backward (launches, dispatch)


# GPUs: large bf16 GEMM-bound layers reach ~60% of the dense peak (typical training MFU is
# 40-60%); a ~2 GFLOP layer (~10 us) runs at half that; ~60 us of launch/dispatch per layer.
GPU_MODEL = DeviceModel(max_efficiency=0.6, half_work_flops=2e9, layer_overhead_s=60e-6)
# CPU: eager PyTorch dispatch costs ~0.3 ms per layer forward+backward; small matmuls lose
# efficiency below a few MFLOP.
CPU_MODEL = DeviceModel(max_efficiency=0.8, half_work_flops=2e6, layer_overhead_s=3e-4)


def device_model(cluster: Cluster) -> DeviceModel:
    return CPU_MODEL if comm.is_cpu(cluster) else GPU_MODEL


def backward_multiplier(op: MetaOp, recompute: bool = False) -> int:
    """Forward+backward FLOPs over forward FLOPs: 3 when training weights (input and weight
    gradients), 2 when frozen but gradients must flow through (input gradients only), 1 with
    no backward pass; recomputing activations adds one forward to a pass with a backward."""
    if not op.needs_backward:
        return 1
    return (2 if op.frozen else 3) + (1 if recompute else 0)


def backward_share(op: MetaOp) -> float:
    """The share of a layer's forward+backward time its backward takes (FLOPs as the
    multiplier counts them): 2/3 training weights, 1/2 passing input gradients only, 0 with
    no backward. A pass runs the forwards and the backwards apart, so the step model and the
    schedulers time a wave's two phases with it."""
    mult = backward_multiplier(op)
    return (mult - 1) / mult


# Kinds the model knows how to split by tensor parallelism: the argument whose divisors are the
# allowed degrees, activation all-reduces per pass, and whether they carry the layer's input
# ("in") or output ("out") tokens. Other kinds (user kinds) run data parallel only.
_TP_RULES: dict[str, tuple[str, int, str]] = {
    "transformer": ("heads", 2, "in"),
    "vit": ("heads", 2, "in"),
    "resampler": ("heads", 2, "out"),
    "mlp": ("out", 1, "in"),
}


@dataclass(frozen=True)
class Config:
    """One way to run one layer on ``devices`` devices (``dp * tp`` busy, the rest idle)."""

    devices: int
    dp: int
    tp: int
    compute_s: float
    tp_comm_s: float
    grad_sync_s: float

    @property
    def used(self) -> int:
        return self.dp * self.tp

    @property
    def seconds(self) -> float:
        return self.compute_s + self.tp_comm_s + self.grad_sync_s


def tp_degrees(op: MetaOp, cluster: Cluster) -> tuple[int, ...]:
    """Tensor-parallel degrees allowed for this op: 1, plus divisors of its split dimension
    that fit in a node."""
    rule = _TP_RULES.get(op.kind)
    if rule is None:
        return (1,)
    dim = int(dict(op.args)[rule[0]])
    return tuple(t for t in range(1, cluster.devices_per_node + 1) if dim % t == 0)


def compute_seconds(flops_per_device: float, cluster: Cluster) -> float:
    """Overhead plus FLOPs at the work-dependent efficiency."""
    model = device_model(cluster)
    if flops_per_device <= 0:
        return model.layer_overhead_s
    efficiency = (
        model.max_efficiency * flops_per_device / (flops_per_device + model.half_work_flops)
    )
    return model.layer_overhead_s + flops_per_device / (cluster.device.peak_flops * efficiency)


def price(op: MetaOp, dp: int, tp: int, cluster: Cluster, recompute: bool = False) -> Config:
    """Seconds of one layer forward+backward with ``dp`` replicas of ``tp``-way layers (with
    the extra forward when it ``recompute``s)."""
    recompute = recompute and op.needs_backward
    shard = comm.ceil_div(op.batch, dp)
    share = shard / op.batch if op.batch else 0.0  # a task the mix leaves out has no samples
    work = backward_multiplier(op, recompute) * op.forward_flops_per_layer * share / tp
    compute = compute_seconds(work, cluster)
    tp_comm = 0.0
    if tp > 1:
        _, per_pass, basis = _TP_RULES[op.kind]
        # the tokens a layer works at (a CLS token more, a stem's fewer), or hands on
        inner = get_kind(op.kind).layer_tokens(dict(op.args), op.tokens)
        tokens = inner if basis == "in" else op.out_tokens
        message = shard * tokens * op.out_width * dtype_bytes(cluster)
        passes = (2 if op.needs_backward else 1) + (1 if recompute else 0)
        bandwidth, latency = comm.link(cluster, crosses_nodes=False)
        tp_comm = per_pass * passes * comm.ring_allreduce_seconds(message, tp, bandwidth, latency)
    grad = 0.0
    if not op.frozen and dp > 1:
        crosses = comm.contiguous_group_spans_nodes(dp * tp, cluster)
        bandwidth, latency = comm.link(cluster, crosses)
        grad = comm.ring_allreduce_seconds(op.param_bytes_per_layer / tp, dp, bandwidth, latency)
    return Config(dp * tp, dp, tp, compute, tp_comm, grad)


@lru_cache(maxsize=4096)
def step_curve(op: MetaOp, cluster: Cluster, recompute: bool = False) -> StepCurve[Config]:
    """T(n) for every n, from the configurations worth pricing (``allocations``): for each
    tensor-parallel degree, the data-parallel degrees at the batch's shard breakpoints."""
    priced = []
    for tp in tp_degrees(op, cluster):
        for dp in shard_breakpoints(op.batch, cluster.devices // tp):
            c = price(op, dp, tp, cluster, recompute)
            priced.append((c.used, c.seconds, c))
    return StepCurve.of(priced)


def _tail(c: Config) -> tuple[int, int, float, float, float]:
    return (c.dp, c.tp, c.compute_s, c.tp_comm_s, c.grad_sync_s)


def best_config(op: MetaOp, cluster: Cluster, n: int, recompute: bool = False) -> Config:
    """The fastest config on ``n`` devices, idle devices allowed (what T_m(n) assumes)."""
    _, c = step_curve(op, cluster, recompute).at(n)
    return Config(n, *_tail(c))


class AnalyticCostModel(comm.LinkPricing):
    """The ``CostModel`` built from FLOPs and datasheets alone (no measurement)."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self._info = MemoryInfoCache()
        # step curves per op without hashing the MetaOp on every call (planning asks per n)
        self._steps: dict[tuple[str, bool], tuple[MetaOp, StepCurve[Config]]] = {}

    def _step(self, op: MetaOp, recompute: bool) -> StepCurve[Config]:
        held = self._steps.get((op.id, recompute))
        if held is None or held[0] is not op:  # same id, another graph: price again
            held = (op, step_curve(op, self.cluster, recompute))
            self._steps[(op.id, recompute)] = held
        return held[1]

    def config(self, op: MetaOp, n: int, recompute: bool = False) -> Config:
        """How one layer of ``op`` runs on ``n`` devices (what T_m(n) assumes)."""
        recompute = recompute and op.needs_backward
        if n == 1:  # the only way
            return price(op, 1, 1, self.cluster, recompute)
        _, c = self._step(op, recompute).at(n)
        return Config(n, *_tail(c))

    def allocations(self, op: MetaOp, recompute: bool = False) -> tuple[int, ...]:
        """The allocations ``op``'s curve lists (``cost.allocations``)."""
        return listed(self._step(op, recompute and op.needs_backward), self.cluster)

    def curves(self, graph: MetaGraph, recompute: frozenset[str] = frozenset()) -> Curves:
        steps = ((op, self._step(op, op.id in recompute and op.needs_backward)) for op in graph)
        return Curves(tuple(curve_of(op.id, s, self.cluster) for op, s in steps), "analytic")

    def memory_bytes(self, op: MetaOp, n: int, layers: int) -> int:
        c = self.config(op, n)
        return slice_memory_bytes(op, layers, c.dp, c.tp, self.cluster, n)

    def alone_bytes(
        self,
        graph: MetaGraph,
        op: MetaOp,
        first: int,
        end: int,
        recompute: bool = False,
        ns: Sequence[int] | None = None,
        zero_stage: int = 1,
        micro_batches: int = 1,
    ) -> tuple[int, ...]:
        rc = recompute and op.needs_backward
        ns = self.allocations(op, rc) if ns is None else ns
        configs = [(n, c.dp, c.tp) for n in ns for c in (self.config(op, n, rc),)]
        info = self._info(graph, op)
        return alone_bytes(
            info, op, first, end, configs, rc, self.cluster, zero_stage, micro_batches
        )

    def slice_memory(
        self,
        graph: MetaGraph,
        op: MetaOp,
        n: int,
        first: int,
        end: int,
        recompute: bool = False,
        zero_stage: int = 1,
        micro_batches: int = 1,
    ) -> SliceMemory:
        c = self.config(op, n, recompute)
        rc = recompute and op.needs_backward
        info = self._info(graph, op)
        return slice_memory(
            info, op, first, end, c.dp, c.tp, rc, self.cluster, zero_stage, micro_batches
        )
