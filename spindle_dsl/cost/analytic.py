"""The analytic cost model: T_m(n) from FLOPs, datasheet peaks and link bandwidths.

T_m(n) is the fastest way of running one layer of a MetaOp on n devices, of these:
- data parallelism over ``dp`` replicas: the batch is split as evenly as possible and the
  largest shard (``ceil(batch / dp)``) sets the time, so no n is ever forbidden;
- tensor parallelism of degree ``tp`` inside one node, for the kinds and degrees the runtime
  splits (``kinds.tp_split.tp_ok``: whole heads or K/V-head groups, whole slices of the
  feed-forward and mlp widths), paying its activation all-reduces (Megatron-style) and,
  since the runtime keeps every layer whole on each rank of the group, the reduction of the
  whole gradient over all ``dp * tp`` ranks;
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost import comm
from spindle_dsl.cost.allocations import (
    ForcedCurve,
    StepCurve,
    curve_of,
    listed,
    shard_breakpoints,
)
from spindle_dsl.cost.base import Curves, SliceMemory
from spindle_dsl.cost.memory import (
    MemoryInfoCache,
    dtype_bytes,
    slice_memory,
    slice_memory_bytes,
)
from spindle_dsl.cost.memory_table import alone_bytes
from spindle_dsl.kinds import get_kind
from spindle_dsl.kinds.tp_split import tp_ok
from spindle_dsl.metagraph import MetaGraph, MetaOp


@dataclass(frozen=True)
class DeviceModel:
    """How far below its peak a device runs one layer (assumed figures, see the docstring)."""

    max_efficiency: float  # fraction of peak a large layer reaches
    half_work_flops: float  # per-device FLOPs at which a layer reaches half of max_efficiency
    layer_overhead_s: float  # fixed seconds per layer forward+backward (launches, dispatch)


# GPUs: large bf16 GEMM-bound layers reach ~60% of the dense peak (typical training MFU is
# 40-60%); a ~2 GFLOP layer (~10 us) runs at half that; ~60 us of launch/dispatch per layer.
# Published runs to check it against (``bench/published_runs.py`` prints them beside the
# prediction): torchtitan's Llama 3 8B reaches 2,973 tokens/s per A100-80GB at 58.2% MFU (64
# GPUs, FSDP, local batch 1, sequence 8,192), and Llama 3.1 8B 5,762 tokens/s per H100 (8 GPUs
# at a 500 W power limit, FSDP, local batch 2), 33-39% MFU (github.com/pytorch/torchtitan,
# docs/performance.md).
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


# Kinds the runtime splits by tensor parallelism (``kinds/tp_split.py``, ``tp_ok``): the
# activation all-reduces per pass (a block: after attention and after the feed-forward net,
# forward; their conjugates backward) and whether they carry the layer's input ("in") or output
# ("out") tokens. Other kinds (the resampler, user kinds) run data parallel only.
_TP_RULES: dict[str, tuple[int, str]] = {
    "transformer": (2, "in"),
    "vit": (2, "in"),
    "mlp": (1, "in"),
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


@lru_cache(maxsize=1024)
def _splits(kind: str, args: tuple, tp: int) -> bool:
    return tp_ok(kind, dict(args), tp) is None


def tp_degrees(op: MetaOp, cluster: Cluster, forced: int | None = None) -> tuple[int, ...]:
    """Tensor-parallel degrees this op may run: 1, and the degrees that fit in a node and
    that the runtime can split its layers into; with ``forced`` (``--tp K``), 1 and K where
    K is one of those."""
    if op.kind not in _TP_RULES or forced == 1:
        return (1,)
    allowed = [t for t in range(2, cluster.devices_per_node + 1) if _splits(op.kind, op.args, t)]
    if forced is not None:
        return (1, forced) if forced in allowed else (1,)
    return (1, *allowed)


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
    bandwidth, latency = comm.link(cluster, crosses_nodes=False)
    tp_comm = tp_comm_seconds(
        op, shard, tp, recompute, cluster,
        lambda nbytes, ranks: comm.ring_allreduce_seconds(nbytes, ranks, bandwidth, latency),
    )  # fmt: skip
    grad = 0.0
    if not op.frozen and dp * tp > 1:
        # every rank of a tensor-parallel group holds the layer whole and a gradient that is
        # non-zero in its slice only: the runtime sums the whole gradient over all dp * tp
        crosses = comm.contiguous_group_spans_nodes(dp * tp, cluster)
        bandwidth, latency = comm.link(cluster, crosses)
        grad = comm.ring_allreduce_seconds(op.param_bytes_per_layer, dp * tp, bandwidth, latency)
    return Config(dp * tp, dp, tp, compute, tp_comm, grad)


def tp_comm_seconds(
    op: MetaOp,
    shard: int,
    tp: int,
    recompute: bool,
    cluster: Cluster,
    allreduce: Callable[[float, int], float],
) -> float:
    """Seconds of one layer's tensor-parallel all-reduces on a shard of ``shard`` rows over
    ``tp`` ranks (0 for ``tp = 1``), ``allreduce(bytes, ranks)`` pricing one: per pass the
    kind's count (``_TP_RULES``), at the tokens a layer works at (a CLS token more, a stem's
    fewer) or hands on, one more forward's worth when it recomputes."""
    if tp <= 1:
        return 0.0
    per_pass, basis = _TP_RULES[op.kind]
    inner = get_kind(op.kind).layer_tokens(dict(op.args), op.tokens)
    tokens = inner if basis == "in" else op.out_tokens
    message = shard * tokens * op.out_width * dtype_bytes(cluster)
    passes = (2 if op.needs_backward else 1) + (1 if recompute else 0)
    return per_pass * passes * allreduce(message, tp)


@lru_cache(maxsize=4096)
def step_curve(
    op: MetaOp, cluster: Cluster, recompute: bool = False, forced: int | None = None
) -> StepCurve[Config] | ForcedCurve[Config]:
    """T(n) for every n, from the configurations worth pricing (``allocations``): for each
    tensor-parallel degree, the data-parallel degrees at the batch's shard breakpoints. With
    ``forced`` K (an op that splits K-way), every n >= K runs K-way, fewer data parallel."""
    degrees = tp_degrees(op, cluster, forced)

    def priced(tp: int, limit: int) -> list[tuple[int, float, Config]]:
        out = []
        for dp in shard_breakpoints(op.batch, limit):
            c = price(op, dp, tp, cluster, recompute)
            out.append((c.used, c.seconds, c))
        return out

    if forced is None or len(degrees) == 1:
        return StepCurve.of(p for tp in degrees for p in priced(tp, cluster.devices // tp))
    below = StepCurve.of(priced(1, forced - 1))  # forced > 1 here: tp_degrees gave (1, K)
    above = StepCurve.of(priced(forced, cluster.devices // forced), least=forced)
    return ForcedCurve(below, above, forced)


def layout_of_config(c: Config) -> tuple[int, int] | None:
    """The (dp, tp) a plan records for a tensor-parallel config (None: data parallel)."""
    return (c.dp, c.tp) if c.tp > 1 else None


def _tail(c: Config) -> tuple[int, int, float, float, float]:
    return (c.dp, c.tp, c.compute_s, c.tp_comm_s, c.grad_sync_s)


def best_config(op: MetaOp, cluster: Cluster, n: int, recompute: bool = False) -> Config:
    """The fastest config on ``n`` devices, idle devices allowed (what T_m(n) assumes)."""
    _, c = step_curve(op, cluster, recompute).at(n)
    return Config(n, *_tail(c))


class AnalyticCostModel(comm.LinkPricing):
    """The ``CostModel`` built from FLOPs and datasheets alone (no measurement)."""

    def __init__(self, cluster: Cluster, tp: int | None = None):
        """``tp``: force that tensor-parallel degree on every entry of a kind that splits
        into it on at least that many devices (1: data parallel only); None lets the
        model choose per MetaOp and allocation."""
        self.cluster = cluster
        self.tp = tp
        self._info = MemoryInfoCache()
        # step curves per op without hashing the MetaOp on every call (planning asks per n)
        self._steps: dict[tuple[str, bool], tuple[MetaOp, StepCurve[Config] | ForcedCurve]] = {}

    def _step(self, op: MetaOp, recompute: bool) -> StepCurve[Config] | ForcedCurve[Config]:
        held = self._steps.get((op.id, recompute))
        if held is None or held[0] is not op:  # same id, another graph: price again
            held = (op, step_curve(op, self.cluster, recompute, self.tp))
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
        curves = tuple(curve_of(op.id, s, self.cluster, layout_of_config) for op, s in steps)
        return Curves(curves, "analytic")

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
