"""The three task losses, written so that data-parallel shards add up to the whole-batch loss.

The training objective is the sum over tasks of each task's mean loss. ``lm`` and ``mse`` are
means of per-sample terms, so each shard returns its *sum* divided by the task's whole-batch
count; the shards' values then add up to the mean exactly as the oracle computes it, and their
gradients add up the same way. ``contrastive`` (symmetric InfoNCE) couples every pair of
samples, so it is not split: the runtime pools and normalises each shard's sink outputs (a
per-sample step), gathers the two readouts of the whole batch on one device and computes the
loss there. Rows with lengths (``masks.py``) score only their real text targets, each lm
shard dividing by the number of those in the whole batch, and read out only their real
positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph, TaskInfo

TEMPERATURE = 0.07  # the contrastive temperature fixed by the contracts


@dataclass(frozen=True)
class LmTarget:
    """Where the text sits in an lm sink's tokens: ``count`` tokens from ``offset``."""

    modality: str
    offset: int
    count: int


def lm_target(graph: MetaGraph, sink_id: str) -> LmTarget:
    """The text positions an lm loss reads: the sink's input from a vocab modality."""
    op = graph.op(sink_id)
    offset = 0
    for inp in op.inputs:
        if inp.from_modality and graph.modality(inp.source).vocab is not None:
            if op.out_tokens != op.tokens:
                raise ExecutionError(
                    f"lm loss on {sink_id}: its output has {op.out_tokens} tokens, not its "
                    f"{op.tokens} input tokens, so text positions are lost; drop out_tokens"
                )
            if inp.tokens < 2:
                raise ExecutionError(f"lm loss on {sink_id} needs at least 2 text tokens")
            return LmTarget(inp.source, offset, inp.tokens)
        offset += inp.tokens
    raise ExecutionError(
        f"lm loss on {sink_id}: the sink reads no token-id modality to predict; "
        f"route text into it (text -> {op.module})"
    )


def check_task(graph: MetaGraph, task: TaskInfo) -> None:
    """Refuse, before anything runs, a task whose loss cannot read its sinks."""
    if task.loss == "lm":
        for s in task.sinks:
            lm_target(graph, s)
    elif task.loss == "contrastive":
        widths = {graph.op(s).out_width for s in task.sinks}
        if len(task.sinks) != 2 or len(widths) != 1:
            raise ExecutionError(
                f"task {task.name}: a contrastive loss needs two sinks of equal width, got "
                f"{', '.join(f'{s} ({graph.op(s).out_width})' for s in task.sinks)}"
            )
    elif task.loss != "mse":
        raise ExecutionError(f"task {task.name}: unknown loss {task.loss!r}")


def lm_loss_part(
    head: torch.nn.Module,
    out: torch.Tensor,
    ids: torch.Tensor,
    where: LmTarget,
    batch: int,
    *,
    targets: torch.Tensor | None = None,
    scored: int | None = None,
) -> torch.Tensor:
    """This shard's share of the mean next-token cross-entropy of a batch of ``batch``;
    ``targets``: the shard's targets with -100 where nothing is scored (``masks.lm_targets``),
    ``scored``: how many targets the whole batch scores (default: every one)."""
    n = where.count
    hidden = out[:, where.offset : where.offset + n - 1]
    logits = head(hidden)
    chosen = ids[:, 1:n] if targets is None else targets
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), chosen.reshape(-1), reduction="sum"
    )  # (-100, the default ignore_index, scores nothing)
    return total / (scored if scored is not None else batch * (n - 1))


def vocab_bounds(vocab: int, rank: int, tp: int) -> tuple[int, int]:
    """The vocabulary entries ``[lo, hi)`` rank ``rank`` of a ``tp``-way group scores: even
    runs of ``ceil(vocab / tp)``, the last one shorter where ``tp`` does not divide it."""
    width = -(-vocab // tp)
    return min(rank * width, vocab), min((rank + 1) * width, vocab)


def vocab_parallel_lm_loss_part(
    head: torch.nn.Module,
    out: torch.Tensor,
    ids: torch.Tensor,
    where: LmTarget,
    batch: int,
    group: Any,
    tp_rank: int,
    tp: int,
    *,
    targets: torch.Tensor | None = None,
    scored: int | None = None,
) -> torch.Tensor:
    """``lm_loss_part`` scored by a tensor-parallel group, this rank its slice of the
    vocabulary (``vocab_bounds``): every rank of ``group`` gets the same loss, the gradient
    of the head's matrix in its own rows, and a share of the gradient of ``out`` that the
    group's shares sum to (the runtime all-reduces it, ``executor``)."""
    n = where.count
    hidden = out[:, where.offset : where.offset + n - 1]
    lo, hi = vocab_bounds(head.weight.shape[0], tp_rank, tp)
    logits = head.logits(hidden, lo, hi)
    chosen = ids[:, 1:n] if targets is None else targets
    per_row = _VocabParallelCrossEntropy.apply(
        logits.reshape(-1, logits.shape[-1]), chosen.reshape(-1), lo, group
    )
    return per_row.sum() / (scored if scored is not None else batch * (n - 1))


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy per row over a vocabulary split across a group, each rank holding the
    logits of ``[lo, lo + width)``: the max, the sum of exponentials and the target's logit
    are all-reduced, so no rank builds the whole row (Megatron-LM's vocab-parallel loss, after
    Shoeybi et al. 2019). A target of -100 scores nothing."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, lo: int, group: Any):
        width = logits.shape[-1]
        top = logits.max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - top.unsqueeze(-1)
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        dist.all_reduce(total, group=group)
        mine = (target >= lo) & (target < lo + width)
        local = torch.where(mine, target - lo, torch.zeros_like(target))
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1) * mine
        dist.all_reduce(picked, group=group)
        scored = target != -100
        ctx.save_for_backward(exp / total.unsqueeze(-1), local, mine, scored)
        return (total.log() - picked) * scored

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, local, mine, scored = ctx.saved_tensors
        grad = grad * scored
        out = softmax * grad.unsqueeze(-1)
        rows = torch.arange(out.shape[0], device=out.device)[mine]
        out[rows, local[mine]] -= grad[mine]
        return out, None, None, None


def lm_loss_positions(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, count: int
) -> torch.Tensor:
    """The share of a mean next-token cross-entropy over ``count`` positions that these
    positions bring (``hidden``: one head input per position; ``targets``: the next token of
    each). A spread lm loss scores any run of positions this way (``Plan.loss_devices``)."""
    logits = head(hidden)
    total = F.cross_entropy(logits, targets, reduction="sum")  # -100 scores nothing
    return total / count


def mse_loss_part(out: torch.Tensor, target: torch.Tensor, batch: int) -> torch.Tensor:
    """This shard's share of the mean squared error over a batch of ``batch``."""
    per_sample = math.prod(target.shape[1:])
    return ((out - target) ** 2).sum() / (batch * per_sample)


def readout(out: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over tokens (the real ones, with ``mask``), then L2-normalised: what a
    contrastive loss compares (per sample)."""
    if mask is None:
        return F.normalize(out.mean(dim=1), dim=-1)
    weights = mask.to(out.dtype).unsqueeze(-1)
    mean = (out * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)
    return F.normalize(mean, dim=-1)


def infonce(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE of two batches of normalised embeddings: sample i of ``a`` should
    match sample i of ``b`` against every other sample of the batch, and the other way round."""
    logits = a @ b.T / TEMPERATURE
    labels = torch.arange(a.shape[0], device=a.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
