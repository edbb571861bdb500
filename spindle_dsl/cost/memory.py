"""Bytes per device to train a slice of a MetaOp, the way Megatron-LM/DeepSpeed-style systems
lay them out.

Parameters, by part (a layer, an input stage, an LM head: the runtime's unit of ownership and
gradient reduction; ``PartBytes``), laid out by the plan's ZeRO stage (``state_split``):
- GPUs train in mixed precision with Adam: bf16 weights and gradients (2 + 2 bytes per
  parameter), fp32 master weights and Adam m and v (4 + 4 + 4 = 12 bytes). The weights stay on
  every device holding the part; with ZeRO-1 (the default, Megatron's
  ``--use-distributed-optimizer``) and ZeRO-2 the 12 bytes are sharded over all the devices
  that hold the part, whichever MetaOps they hold it for, and stage 0 keeps them whole on
  every holder. A frozen part keeps only its bf16 weights (2 bytes), whatever the stage.
- The ``cpu`` preset trains in fp32: weights 4, gradients 4, Adam m and v 4 + 4 bytes.
Gradients are counted where the runtime keeps them (``docs/runtime.md``; ``GradientLife``,
``gradient_life``): a part's whole gradient exists from its first backward until its bucket's
collective is issued in the reducing pass, and under ZeRO-1 and ZeRO-2 each holder then keeps
its reduced shard until the update. So with one pass no gradient is alive at the end of the
forward, where the peak usually is; with k > 1 passes under stage 0 or 1 the accumulated
gradients are alive through every later forward, under ZeRO-2 the shards are; at the end of
the backward every gradient is alive under stage 0, the shards and at most one bucket in
flight (``GRAD_BUCKET_ELEMENTS``, the runtime's bucket cap) under ZeRO-1 and ZeRO-2.
Tensor parallelism leaves the weights whole: the runtime keeps a tensor-parallel layer whole on
every rank of its group and runs that rank's slice of it (``backends/torch/tensor_parallel.py``,
``ShardView``), so its parameter state is priced as a data-parallel layer's (ZeRO-1 and ZeRO-2
shard the optimizer state and gradients over the holders, the group's ranks among them). A
MetaOp's input stages live with
its first layer and a task's LM head with the sink's last layer, where the runtime puts them;
a tied head's embedding stage (``cost/tied.py``) lives with the head as well.

Activations, per device (data parallelism splits the batch as ``ceil(batch / dp)``; tensor
parallelism splits a layer's heads and inner widths but not its input, norms and residual
stream, which every rank of the group holds whole: ``tp_activation_share``):
- kept for backward: every layer's saved tensors (``Kind.activation_elements``, what autograd
  saves), or with activation recompute (full per-layer checkpointing) only each layer's input
  (tokens x in_width);
- the loss phase: an LM sink's log-probabilities (text tokens - 1) x (vocab + LayerNorm and
  head inputs), a tensor-parallel group's split by vocabulary (each rank its slice). The
  runtime back-propagates its losses as soon as the loss phase has computed them, so they
  never wait for the waves' backward, but the loss phase runs while every kept activation of
  the pass is alive and computes every loss of the device before it back-propagates them
  together: they add up with the kept activations at the peak, not after;
- working, alive only while one layer runs: with recompute, the layer's full saved tensors
  rebuilt for its backward; without a backward pass, one layer's activations; the logits
  while the loss is computed.
An op's output is its consumers' input, so it is counted there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost.base import GradientLife, PartBytes, SliceMemory
from spindle_dsl.cost.comm import ceil_div, is_cpu
from spindle_dsl.cost.tied import tied_embedding_modality
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph, MetaOp


def dtype_bytes(cluster: Cluster) -> int:
    """Bytes per parameter/activation element at the training dtype (fp32 on cpu, else bf16)."""
    return 4 if is_cpu(cluster) else 2


ZERO_STAGES = (0, 1, 2)
# Gradient elements the runtime reduces in one bucket (``backends/torch/shards.py``,
# MAX_BUCKET_ELEMENTS): at most this much of a device's whole gradient is in flight once the
# buckets are being reduce-scattered.
GRAD_BUCKET_ELEMENTS = 1 << 22


def state_split(cluster: Cluster, trainable: bool, zero_stage: int = 1) -> tuple[int, int]:
    """(replicated, sharded) bytes per parameter that stay alive all step under ZeRO stage
    ``zero_stage``: the weights on every holder, the optimizer state whole on every holder
    (stage 0) or sharded over the holders (1 and 2). Gradients are apart (``grad_bytes``)."""
    dt = dtype_bytes(cluster)
    if not trainable:
        return (dt, 0)
    optimizer = 8 if is_cpu(cluster) else 12  # Adam m, v (and fp32 masters below fp32)
    if zero_stage == 0:
        return (dt + optimizer, 0)
    return (dt, optimizer)


def grad_bytes(cluster: Cluster, trainable: bool) -> int:
    """Gradient bytes per parameter (the training dtype; none for a frozen part)."""
    return dtype_bytes(cluster) if trainable else 0


def state_bytes_per_param(cluster: Cluster, trainable: bool) -> int:
    """Parameter + gradient + optimizer bytes per parameter, before any sharding."""
    return sum(state_split(cluster, trainable)) + grad_bytes(cluster, trainable)


def gradient_life(cluster: Cluster, micro_batches: int = 1, zero_stage: int = 1) -> GradientLife:
    """When gradients are alive with ``micro_batches`` passes under ``zero_stage`` (see the
    module docstring and ``GradientLife``)."""
    k = max(1, micro_batches)
    return GradientLife(
        carried=k > 1 and zero_stage < 2,
        shards_carried=k > 1 and zero_stage == 2,
        whole_backward=zero_stage == 0,
        bucket=GRAD_BUCKET_ELEMENTS * dtype_bytes(cluster),
    )


def staged(part: PartBytes, zero_stage: int) -> PartBytes:
    """An unsplit (no tensor parallelism) part given in the ZeRO-1 layout, laid out for
    ``zero_stage``: stage 0 keeps the optimizer state whole (replicated) and shards no
    gradient; ZeRO-2 lays parameters out as ZeRO-1 does (it differs in when gradients live)."""
    if zero_stage == 0:
        return replace(part, replicated=part.replicated + part.sharded, sharded=0, grads_sharded=0)
    return part


def activation_elements_per_sample(op: MetaOp) -> float:
    """One layer's saved activations for one sample, as the op's kind counts them; what the
    module's last layer saves beyond its block (its tail) is spread over the layers, as the
    lowering spreads the tail's FLOPs."""
    kind, args = get_kind(op.kind), dict(op.args)
    tail = kind.tail_activations(args, op.tokens) / max(op.layers, 1)
    return kind.activation_elements(args, op.tokens) + tail


def layer_input_elements_per_sample(op: MetaOp) -> float:
    """What a recomputing layer keeps for one sample: its input (every layer of a MetaOp is
    costed at the tokens its layers work at, as the kinds cost them)."""
    return float(get_kind(op.kind).layer_tokens(dict(op.args), op.tokens) * op.in_width)


# The share of a transformer layer's saved activations that tensor parallelism without
# sequence parallelism leaves whole on every rank: 10 of the 34 bytes per token and hidden
# unit (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
# Models", Table 2: s*b*h*(10 + 24/t) plus the attention scores, which split by heads).
TP_WHOLE_ACTIVATIONS = 10 / 34


def tp_activation_share(tp: int) -> float:
    """The share of a layer's saved activations one rank of a ``tp``-way group holds."""
    return 1.0 if tp <= 1 else TP_WHOLE_ACTIVATIONS + (1 - TP_WHOLE_ACTIVATIONS) / tp


def _part(
    key: str, params: float, tp: int, cluster: Cluster, trainable: bool, zero_stage: int = 1
) -> PartBytes:
    """A part's bytes per holder (``tp`` does not divide them: see the module docstring)."""
    rep, shard = state_split(cluster, trainable, zero_stage)
    g = grad_bytes(cluster, trainable)
    return PartBytes(
        key,
        int(params * rep),
        int(params * shard),
        grads=int(params * g),
        grads_sharded=int(params * g) if zero_stage >= 1 else 0,
    )


def layer_parts(
    op: MetaOp, first: int, end: int, tp: int, cluster: Cluster, zero_stage: int = 1
) -> list[PartBytes]:
    """The layer parts of op layers ``[first, end)`` laid out for ``zero_stage``: one run per
    module it crosses (``PartBytes.layers``), named by module and layer range, so that
    nothing here or in the planner counts layers one by one."""
    out: list[PartBytes] = []
    offset = 0
    for module, count in op.segments:
        lo, hi = max(first, offset) - offset, min(end, offset + count) - offset
        if hi > lo:
            one = _part("", op.params_per_layer, tp, cluster, not op.frozen, zero_stage)
            k = hi - lo
            out.append(
                PartBytes(
                    f"{module}/layers.{lo}-{hi}",
                    one.replicated * k,
                    one.sharded * k,
                    (lo, hi),
                    grads=one.grads * k,
                    grads_sharded=one.grads_sharded * k,
                )
            )
        offset += count
    return out


def lm_text_tokens(graph: MetaGraph, op: MetaOp) -> int:
    """Text tokens an LM loss reads on ``op`` (0 unless ``op`` is an lm sink with a head)."""
    task = graph.task(op.task)
    kind = get_kind(op.kind)
    if task.loss != "lm" or op.id not in task.sinks or not kind.head_params(dict(op.args)):
        return 0
    for inp in op.inputs:
        if inp.from_modality and graph.modality(inp.source).vocab is not None:
            return inp.tokens
    return 0


@dataclass(frozen=True)
class OpMemoryInfo:
    """What pricing a slice's memory needs of the graph around one op, read off it once."""

    activations: float  # elements one layer keeps for backward, per sample
    layer_input: float  # elements of one layer's input, per sample
    inputs: tuple[PartBytes, ...]  # input stages, held with the first layer
    head: PartBytes | None  # the LM head, held with the last layer
    text_tokens: int  # tokens the LM loss reads (0: no LM loss on this op)
    vocab: int
    tied: PartBytes | None = None  # the input stage a tied head multiplies by, held with it
    tail: PartBytes | None = None  # what the last layer holds beyond its block (kinds/tower.py)

    def last_layer_parts(self, first: int) -> tuple[PartBytes, ...]:
        """The parts a slice ending at the op's last layer holds besides its layers: the
        last layer's tail, the head and, for a tied head, the embedding stage it multiplies
        by (unless the slice starts at layer 0 and holds that stage as its input already)."""
        out = [] if self.head is None else [self.head]
        if self.tail is not None:
            out.append(self.tail)
        if self.tied is not None and not (
            first == 0 and any(p.key == self.tied.key for p in self.inputs)
        ):
            out.append(self.tied)
        return tuple(out)


def op_memory_info(graph: MetaGraph, op: MetaOp) -> OpMemoryInfo:
    cluster = graph.cluster
    kind = get_kind(op.kind)
    first = graph.module(op.segments[0][0])
    inputs = []
    for inp in op.inputs:
        if inp.from_modality:
            params = kind.input_stage_params(
                dict(first.args), graph.stage_modality(first.name, inp.source)
            )
            key = f"{first.name}/input.{inp.source}"
            inputs.append(_part(key, params, 1, cluster, not first.frozen))
    text = lm_text_tokens(graph, op)
    last_module = graph.module(op.segments[-1][0])
    tail_params = get_kind(last_module.kind).tail_params(dict(last_module.args))
    tail = None
    if tail_params:
        key = f"{last_module.name}/tail"
        tail = _part(key, tail_params, 1, cluster, not last_module.frozen)
    head = tied = None
    if text:
        last = graph.module(op.segments[-1][0])
        params = kind.head_params(dict(last.args))
        head = _part(f"{last.name}/head", params, 1, cluster, not last.frozen)
        modality = tied_embedding_modality(graph, last.name)
        if modality is not None:
            params = kind.input_stage_params(
                dict(last.args), graph.stage_modality(last.name, modality)
            )
            key = f"{last.name}/input.{modality}"
            tied = _part(key, params, 1, cluster, not last.frozen)
    return OpMemoryInfo(
        activation_elements_per_sample(op),
        layer_input_elements_per_sample(op),
        tuple(inputs),
        head,
        text,
        int(dict(op.args).get("vocab") or 0),
        tied,
        tail,
    )


class MemoryInfoCache:
    """``op_memory_info`` per op of the graph last asked about (planning asks about one graph
    many thousand times; the graph is held, so its identity cannot be reused)."""

    def __init__(self) -> None:
        self._graph: MetaGraph | None = None
        self._memo: dict[str, OpMemoryInfo] = {}

    def __call__(self, graph: MetaGraph, op: MetaOp) -> OpMemoryInfo:
        if graph is not self._graph:
            self._graph, self._memo = graph, {}
        info = self._memo.get(op.id)
        if info is None:
            info = self._memo[op.id] = op_memory_info(graph, op)
        return info


def slice_activations(
    op: MetaOp,
    layers: int,
    dp: int,
    tp: int,
    cluster: Cluster,
    recompute: bool,
    info: OpMemoryInfo | None = None,
) -> tuple[int, int]:
    """(kept, working) activation bytes per device for ``layers`` layers of ``op``."""
    if layers <= 0 or op.batch <= 0:
        return (0, 0)
    per_device = ceil_div(op.batch, dp) * dtype_bytes(cluster)
    act = info.activations if info else activation_elements_per_sample(op)
    full = act * per_device * tp_activation_share(tp)
    if not op.needs_backward:
        return (0, int(full))
    if recompute:  # a layer's input is whole on every rank of the group
        layer_in = info.layer_input if info else layer_input_elements_per_sample(op)
        return (int(layer_in * per_device * layers), int(full))
    return (int(full * layers), 0)


def head_activations(
    op: MetaOp, info: OpMemoryInfo, dp: int, cluster: Cluster, tp: int = 1
) -> tuple[int, int]:
    """(loss, working) bytes per device of an LM sink's loss phase: the log-probabilities and
    the head's inputs, alive until the losses are back-propagated; the logits while the
    cross-entropy runs. A ``tp``-way group scores its rows split by vocabulary, each device
    its ``ceil(vocab / tp)`` entries."""
    if info.text_tokens < 2 or op.batch <= 0:
        return (0, 0)
    rows = ceil_div(op.batch, dp) * (info.text_tokens - 1) * dtype_bytes(cluster)
    vocab = ceil_div(info.vocab, tp)
    loss = rows * (vocab + 2 * op.out_width) if op.needs_backward else 0
    return (loss, rows * vocab)


def slice_memory(
    info: OpMemoryInfo,
    op: MetaOp,
    first: int,
    end: int,
    dp: int,
    tp: int,
    recompute: bool,
    cluster: Cluster,
    zero_stage: int = 1,
    micro_batches: int = 1,
) -> SliceMemory:
    """Bytes per device to run layers ``[first, end)`` of ``op`` as ``dp`` data-parallel
    replicas of ``tp``-way tensor-parallel layers, parameter state laid out for
    ``zero_stage``, gradients alive as ``micro_batches`` passes keep them (see the module
    docstring); ``info`` is ``op_memory_info(graph, op)`` and ``op`` carries one pass's
    batch."""
    parts = layer_parts(op, first, end, tp, cluster, zero_stage)
    if first == 0:
        parts.extend(staged(p, zero_stage) for p in info.inputs)
    kept, working = slice_activations(op, end - first, dp, tp, cluster, recompute, info)
    loss = 0
    if end == op.layers:
        parts.extend(staged(p, zero_stage) for p in info.last_layer_parts(first))
        loss, head_working = head_activations(op, info, dp, cluster, tp)
        working = max(working, head_working)
    life = gradient_life(cluster, micro_batches, zero_stage)
    return SliceMemory(tuple(parts), kept, working, loss, life)


def slice_memory_bytes(
    op: MetaOp, layers: int, dp: int, tp: int, cluster: Cluster, n: int | None = None
) -> int:
    """Peak bytes on ``n`` devices (default ``dp * tp``) running ``layers`` layers of ``op``
    and nothing else, one pass under ZeRO-1: the layers' weights, their optimizer state
    sharded over the ``n`` devices, and the larger of their activations without recompute and
    their gradients in the backward (no input stages or head: those need the graph, see
    ``slice_memory``)."""
    trainable = not op.frozen
    rep, shard = state_split(cluster, trainable)
    g = grad_bytes(cluster, trainable)
    n = n or dp * tp
    params = op.params_per_layer * layers
    kept, working = slice_activations(op, layers, dp, tp, cluster, recompute=False)
    alive = gradient_life(cluster).peak(kept, params * g, params * g / n)
    return int(params * (rep + shard / n) + alive) + working
