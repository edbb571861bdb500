"""Bytes per device to train a slice of a MetaOp, the way Megatron-LM/DeepSpeed-style systems
lay them out.

Parameters, by part (a layer, an input stage, an LM head: the runtime's unit of ownership and
gradient reduction; ``PartBytes``):
- GPUs train in mixed precision with Adam and a distributed optimizer (ZeRO-1, Megatron's
  ``--use-distributed-optimizer``): bf16 weights and gradients stay on every device holding
  the part (2 + 2 = 4 bytes per parameter), the fp32 master weights and Adam m and v
  (4 + 4 + 4 = 12 bytes) are sharded over all the devices that hold the part, whichever
  MetaOps they hold it for. A frozen part keeps only its bf16 weights (2 bytes).
- The ``cpu`` preset trains in fp32: weights and gradients (4 + 4) replicated, Adam m and v
  (4 + 4) sharded; frozen, 4 bytes.
Tensor parallelism splits a layer's weights over its degree. A MetaOp's input stages live with
its first layer and a task's LM head with the sink's last layer, where the runtime puts them.

Activations, per device (data parallelism splits the batch as ``ceil(batch / dp)``, tensor
parallelism with sequence parallelism divides by its degree):
- kept for backward: every layer's saved tensors (``Kind.activation_elements``), or with
  activation recompute (full per-layer checkpointing) only each layer's input (tokens x
  in_width), plus an LM sink's log-probabilities (text tokens - 1) x (vocab + LayerNorm and
  head inputs), which the cross-entropy keeps until the backward pass;
- working, alive only while one layer runs: with recompute, the layer's full saved tensors
  rebuilt for its backward; without a backward pass, one layer's activations; the logits
  while the loss is computed.
An op's output is its consumers' input, so it is counted there.
"""

from __future__ import annotations

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost.base import PartBytes, SliceMemory
from spindle_dsl.cost.comm import ceil_div, is_cpu
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph, MetaOp


def dtype_bytes(cluster: Cluster) -> int:
    """Bytes per parameter/activation element at the training dtype (fp32 on cpu, else bf16)."""
    return 4 if is_cpu(cluster) else 2


def state_split(cluster: Cluster, trainable: bool) -> tuple[int, int]:
    """(replicated, sharded) bytes per parameter: see the module docstring."""
    if not trainable:
        return (dtype_bytes(cluster), 0)
    return (8, 8) if is_cpu(cluster) else (4, 12)


def state_bytes_per_param(cluster: Cluster, trainable: bool) -> int:
    """Parameter + gradient + optimizer bytes per parameter, before any sharding."""
    return sum(state_split(cluster, trainable))


def activation_elements_per_sample(op: MetaOp) -> float:
    """One layer's saved activations for one sample, as the op's kind counts them."""
    return get_kind(op.kind).activation_elements(dict(op.args), op.tokens)


def layer_input_elements_per_sample(op: MetaOp) -> float:
    """What a recomputing layer keeps for one sample: its input (every layer of a MetaOp is
    costed at the MetaOp's input tokens, as the kinds cost them)."""
    return float(op.tokens * op.in_width)


def _part(key: str, params: float, tp: int, cluster: Cluster, trainable: bool) -> PartBytes:
    rep, shard = state_split(cluster, trainable)
    return PartBytes(key, int(params * rep / tp), int(params * shard))


def layer_parts(op: MetaOp, first: int, end: int, tp: int, cluster: Cluster) -> list[PartBytes]:
    """The layer parts of op layers ``[first, end)``, named by module and layer index."""
    out: list[PartBytes] = []
    offset = 0
    for module, count in op.segments:
        lo, hi = max(first, offset), min(end, offset + count)
        for j in range(lo - offset, hi - offset):
            key = f"{module}/layer.{j}"
            out.append(_part(key, op.params_per_layer, tp, cluster, not op.frozen))
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


def edge_parts(graph: MetaGraph, op: MetaOp, first: int, end: int) -> list[PartBytes]:
    """Input stages (with the first layer) and the LM head (with the last one)."""
    cluster, out = graph.cluster, []
    kind = get_kind(op.kind)
    if first == 0:
        module = graph.module(op.segments[0][0])
        for inp in op.inputs:
            if inp.from_modality:
                stage = graph.stage_modality(module.name, inp.source)
                params = kind.input_stage_params(dict(module.args), stage)
                key = f"{module.name}/input.{inp.source}"
                out.append(_part(key, params, 1, cluster, not module.frozen))
    if end == op.layers and lm_text_tokens(graph, op):
        module = graph.module(op.segments[-1][0])
        params = kind.head_params(dict(module.args))
        out.append(_part(f"{module.name}/head", params, 1, cluster, not module.frozen))
    return out


def slice_activations(
    op: MetaOp, layers: int, dp: int, tp: int, cluster: Cluster, recompute: bool
) -> tuple[int, int]:
    """(kept, working) activation bytes per device for ``layers`` layers of ``op``."""
    if layers <= 0 or op.batch <= 0:
        return (0, 0)
    per_device = ceil_div(op.batch, dp) * dtype_bytes(cluster) / tp
    full = activation_elements_per_sample(op) * per_device
    if not op.needs_backward:
        return (0, int(full))
    if recompute:
        return (int(layer_input_elements_per_sample(op) * per_device * layers), int(full))
    return (int(full * layers), 0)


def head_activations(graph: MetaGraph, op: MetaOp, dp: int) -> tuple[int, int]:
    """(kept, working) bytes per device of an LM sink's loss: log-probabilities and the head's
    inputs kept for backward; the logits while the cross-entropy runs."""
    text = lm_text_tokens(graph, op)
    if text < 2 or op.batch <= 0:
        return (0, 0)
    vocab = int(dict(op.args)["vocab"])
    rows = ceil_div(op.batch, dp) * (text - 1) * dtype_bytes(graph.cluster)
    kept = rows * (vocab + 2 * op.out_width) if op.needs_backward else 0
    return (kept, rows * vocab)


def slice_memory(
    graph: MetaGraph, op: MetaOp, first: int, end: int, dp: int, tp: int, recompute: bool
) -> SliceMemory:
    """Bytes per device to run layers ``[first, end)`` of ``op`` as ``dp`` data-parallel
    replicas of ``tp``-way tensor-parallel layers (see the module docstring)."""
    cluster = graph.cluster
    parts = layer_parts(op, first, end, tp, cluster) + edge_parts(graph, op, first, end)
    kept, working = slice_activations(op, end - first, dp, tp, cluster, recompute)
    if end == op.layers:
        head_kept, head_working = head_activations(graph, op, dp)
        kept, working = kept + head_kept, max(working, head_working)
    return SliceMemory(tuple(parts), kept, working)


def slice_memory_bytes(
    op: MetaOp, layers: int, dp: int, tp: int, cluster: Cluster, n: int | None = None
) -> int:
    """Peak bytes on ``n`` devices (default ``dp * tp``) running ``layers`` layers of ``op``
    and nothing else: the layers' parameters with their optimizer state sharded over the
    ``n`` devices, and their activations without recompute (no input stages or head: those
    need the graph, see ``slice_memory``)."""
    rep, shard = state_split(cluster, not op.frozen)
    states = op.params_per_layer * layers * (rep / tp + shard / (n or dp * tp))
    kept, working = slice_activations(op, layers, dp, tp, cluster, recompute=False)
    return int(states) + kept + working
