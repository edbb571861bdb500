"""The tensor-parallel modules: each built-in layer's own forward, run over one rank's shard of
its weights with Megatron's communication operators at the edges of the parallel regions.

``tensor_parallel.py`` says what each module computes and builds them (``shard_layer``); the
weights' layout is ``tp_split.py``'s. The operators are autograd functions over
``torch.distributed`` collectives on the tensor-parallel group:

- ``enter`` (Megatron's f): identity forward; backward, the group's sum of the input
  gradients (each rank's region saw the whole input but used only its slice of the weights);
- ``leave`` (Megatron's g): the group's sum of the partial outputs forward; identity backward
  (the rows downstream are replicated, so every rank gets the same output gradient);
- ``gather_last``: all-gather along the last dimension forward; backward, this rank's slice of
  the gradient (downstream is replicated, so each rank already holds the whole gradient).

A degree of 1 communicates nothing and needs no process group.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from spindle_dsl.errors import ExecutionError
from spindle_dsl.kinds.common import BlockShape
from spindle_dsl.kinds.layers import (
    EmbeddingStage,
    FeedForward,
    LMHead,
    MlpLayer,
    SelfAttentionBlock,
    SwiGLUFeedForward,
    pool_tokens,
)

Group = Any  # a torch.distributed ProcessGroup, or None for the default group


# --- the conjugate communication operators -----------------------------------------------------


def _summed(x: torch.Tensor, group: Group) -> torch.Tensor:
    """A new contiguous tensor: ``x`` summed over the group."""
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


class _Enter(torch.autograd.Function):
    """Megatron's f: identity forward; backward, the sum of the ranks' input gradients (each
    rank's region saw the whole input but used only its slice of the weights)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _summed(grad, ctx.group), None


class _Leave(torch.autograd.Function):
    """Megatron's g: the sum of the ranks' partial outputs forward; identity backward (every
    rank gets the same output gradient, as the rows downstream are replicated)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        return _summed(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherLast(torch.autograd.Function):
    """All-gather along the last dimension forward; backward, this rank's slice of the
    gradient (downstream is replicated, so each rank already holds the whole gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group, tp: int, tp_rank: int) -> torch.Tensor:
        ctx.width, ctx.tp_rank = x.shape[-1], tp_rank
        x = x.contiguous()
        pieces = [torch.empty_like(x) for _ in range(tp)]
        dist.all_gather(pieces, x, group=group)
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        w = ctx.width
        return grad[..., ctx.tp_rank * w : (ctx.tp_rank + 1) * w].contiguous(), None, None, None


class _Comm:
    """What a tensor-parallel module knows of its group; a degree of 1 communicates nothing
    (and needs no process group)."""

    tp: int
    tp_rank: int
    group: Group

    def _set_group(self, tp: int, tp_rank: int, group: Group) -> None:
        self.tp, self.tp_rank, self.group = tp, tp_rank, group

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.tp == 1 else _Enter.apply(x, self.group)

    def leave(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.tp == 1 else _Leave.apply(x, self.group)

    def gather_last(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.tp == 1 else _GatherLast.apply(x, self.group, self.tp, self.tp_rank)


# --- the tensor-parallel modules (each the built-in layer with the communication added) ---------


class RowParallelLinear(_Comm, nn.Module):
    """``Linear(n_in_local, n_out)`` over this rank's input slice: the partial products summed
    over the group, then the bias (replicated) added once."""

    def __init__(self, n_in: int, n_out: int, bias: bool, tp: int, tp_rank: int, group: Group):
        super().__init__()
        self._set_group(tp, tp_rank, group)
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.empty(n_out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.leave(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class ColumnGatherLinear(_Comm, nn.Linear):
    """``Linear(n_in, n_out_local)`` whose outputs are gathered from the group: the whole
    ``n_out`` on every rank."""

    def __init__(self, n_in: int, n_out: int, tp: int, tp_rank: int, group: Group):
        super().__init__(n_in, n_out)
        self._set_group(tp, tp_rank, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gather_last(super().forward(self.enter(x)))


class _TpFeed(_Comm):
    """A feed-forward net's tensor-parallel form, whichever net it extends: fc1
    column-parallel (``ffn`` local), fc2 row-parallel and summed over the group."""

    def __init__(
        self, width: int, ffn: int, bias: bool, act: str, tp: int, tp_rank: int, group: Group
    ):
        super().__init__(width, ffn, bias=bias, act=act)  # the net's own layers, ``ffn`` wide
        self._set_group(tp, tp_rank, group)
        self.fc2 = RowParallelLinear(ffn, width, bias, tp, tp_rank, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.enter(x))


class TpFeedForward(_TpFeed, FeedForward):
    """``FeedForward`` with fc1 column-parallel and fc2 row-parallel (``ffn`` local)."""


class TpSwiGLUFeedForward(_TpFeed, SwiGLUFeedForward):
    """``SwiGLUFeedForward`` whose fused fc1 holds this rank's gate rows then the same rows of
    up (``ffn`` local), so its ``chunk(2)`` pairs them as the full layer does."""


def feed_forward(
    width: int, ffn: int, bias: bool, act: str, tp: int, tp_rank: int, group: Group
) -> nn.Module:
    cls = TpSwiGLUFeedForward if act == "swiglu" else TpFeedForward
    return cls(width, ffn // tp, bias, act, tp, tp_rank, group)


def local_block_shape(shape: BlockShape, tp: int) -> BlockShape:
    """The block one rank runs: ``1/tp`` of the heads, K/V heads and feed-forward width, the
    head width and everything else unchanged."""
    return replace(
        shape,
        heads=shape.heads // tp,
        kv_heads=shape.kv_heads // tp,
        ffn=shape.ffn // tp,
        head_width=shape.head_dim,
    )


class TpSelfAttentionBlock(_Comm, SelfAttentionBlock):
    """``SelfAttentionBlock`` run by one rank: the block's own forward over its local heads,
    with the q/k/v input entering and the output projection leaving the parallel region; a
    module's last block also runs its (replicated) tail and pooling, as ``TailedBlock``."""

    def __init__(
        self,
        shape: BlockShape,
        causal: bool,
        out_tokens: int | None,
        tp: int,
        tp_rank: int,
        group: Group,
        tail: nn.Module | None = None,
        pool_to: int | None = None,
    ):
        local = local_block_shape(shape, tp)
        super().__init__(local, causal, out_tokens)
        self._set_group(tp, tp_rank, group)
        self.full_shape = shape
        self.proj = RowParallelLinear(
            local.q_width, shape.hidden, shape.has_out_bias, tp, tp_rank, group
        )
        self.ffn = feed_forward(shape.hidden, shape.ffn, shape.bias, shape.act, tp, tp_rank, group)
        self.tail = tail
        self.pool_to = pool_to

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        return super()._qkv(self.enter(x))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = super().forward(x, mask)
        return y if self.tail is None else pool_tokens(self.tail(y), self.pool_to)


class TpMlpLayer(_Comm, MlpLayer):
    """``MlpLayer`` run by one rank: column- then row-parallel over the hidden width, or its
    single Linear column-parallel with gathered outputs."""

    def __init__(
        self,
        n_in: int,
        n_out: int,
        hidden: int | None,
        out_tokens: int | None,
        tp: int,
        tp_rank: int,
        group: Group,
    ):
        super().__init__(n_in, n_out, None if hidden is None else hidden // tp, out_tokens)
        self._set_group(tp, tp_rank, group)
        if hidden is None:
            self.net = ColumnGatherLinear(n_in, n_out // tp, tp, tp_rank, group)
        else:
            self.net[2] = RowParallelLinear(hidden // tp, n_out, True, tp, tp_rank, group)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(self.net, ColumnGatherLinear):  # it enters the region itself
            return super().forward(x, mask)
        return super().forward(self.enter(x), mask)


class TpEmbeddingStage(_Comm, EmbeddingStage):
    """``EmbeddingStage`` holding the vocabulary rows ``[vocab_start, vocab_start + rows)``:
    ids outside them look up zeros, and the group's sum is the full lookup."""

    def __init__(
        self,
        rows: int,
        tokens: int,
        width: int,
        learned: bool,
        tp: int,
        tp_rank: int,
        group: Group,
    ):
        super().__init__(rows, tokens, width, learned)
        self._set_group(tp, tp_rank, group)
        self.vocab_start = tp_rank * rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < self.embed.num_embeddings)
        found = self.embed(torch.where(inside, local, torch.zeros_like(local)))
        return self.add_positions(self.leave(found.masked_fill(~inside[..., None], 0.0)))


class TpLMHead(_Comm, LMHead):
    """``LMHead`` over this rank's vocabulary rows (its own, or its tied stage's), the logits
    gathered along the vocabulary: every rank returns the full logits."""

    def __init__(
        self,
        hidden: int,
        rows: int,
        norm: str,
        tied: bool,
        eps: float,
        tp: int,
        tp_rank: int,
        group: Group,
    ):
        super().__init__(hidden, rows, norm=norm, tied=tied, eps=eps)
        self._set_group(tp, tp_rank, group)

    def tie_to(self, stage: EmbeddingStage) -> None:
        mine = (self.tp, self.tp_rank)
        if not isinstance(stage, TpEmbeddingStage) or (stage.tp, stage.tp_rank) != mine:
            raise ExecutionError(
                "a tensor-parallel LM head must be tied to the embedding stage sharded for the "
                "same rank of the same group"
            )
        super().tie_to(stage)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.enter(self.ln(x))
        if self.out is not None:
            return self.gather_last(self.out(x))
        if not self._tied:
            raise ExecutionError("a tied LM head was sharded without its token embedding")
        return self.gather_last(F.linear(x, self._tied[0].embed.weight))
