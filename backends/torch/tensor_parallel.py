"""Megatron-style tensor parallelism of the built-in layers, for one group of ranks.

``shard_layer(layer, tp_rank, tp, group)`` turns a full built-in layer into the module rank
``tp_rank`` of a ``tp``-rank group runs: every rank of the group feeds it the same whole rows
(plain full tensors) and gets the layer's whole output back, equal to what ``layer`` computes
up to the order of a sum, and after backward each rank's parameters hold their slice of the
full layer's gradients (replicated ones, norms and the like, the whole gradient on every rank,
since every rank sees the same rows). Where each parameter goes is ``tp_split.py``'s layout.

- ``SelfAttentionBlock`` (and a module's last block with its tail): attention by K/V-head
  groups (each rank holds whole K/V heads and the query heads they serve; with as many K/V
  heads as heads, simply by heads), the fused q/k/v weight and biases sliced per segment;
  rotary, the causal and the padding masks apply per local head unchanged. The output
  projection is row-parallel: its partial products are summed over the group, then its bias
  is added once. Norms, residuals, the tail and ``out_tokens`` pooling run replicated.
- ``FeedForward`` / ``SwiGLUFeedForward``: fc1 column-parallel (SwiGLU: matching gate and up
  slices), the activation local, fc2 row-parallel and summed.
- ``MlpLayer``: with a hidden layer as the feed-forward net; a single Linear column-parallel
  over its outputs, which are then gathered.
- ``LMHead`` and ``EmbeddingStage`` (an option of ``shard_layer``): by vocabulary. The head
  gathers its logits along the vocabulary, so every rank holds the full logits; the
  embedding looks up the ids in its rows, zeroes the others and sums over the group (exact:
  one term is non-zero). A tied head multiplies by its sharded stage's rows. The runtime
  scores a tensor-parallel group's lm loss without gathering: each rank computes the logits
  of its vocabulary slice and a vocabulary-parallel cross-entropy
  (``losses.vocab_parallel_lm_loss_part``), so no rank holds the full logits.

Communication is Megatron's conjugate pair of autograd functions over ``all_reduce`` on the
group (``tp_layers.py``): identity forward and summed input gradients backward where a
replicated tensor enters a column-parallel region, summed partial outputs forward and identity
backward where a row-parallel region's outputs leave it.

Why not PyTorch's ``torch.distributed.tensor.parallel`` (``parallelize_module``,
``ColwiseParallel``, ``RowwiseParallel`` over a ``DeviceMesh``): it runs on gloo and the CPU,
but it fits neither these layers nor this runtime. Its styles shard a Linear's weight as one
contiguous block (``Shard(0)`` / ``Shard(1)``), while the blocks fuse q, k and v into one
weight (query heads, then K heads, then V heads, grouped by K/V head) and SwiGLU fuses gate
and up into one fc1: a contiguous block would hand a rank all of q and none of v, or gate
rows without their up rows; splitting those Linears apart would change the parameter names
that checkpoints and pretrained weight files use. And it replaces each parameter by a
``DTensor`` parameter whose gradient is a ``DTensor``, where the runtime's ``PartStore``,
ZeRO optimizer sharding, bucketed gradient reduction, checkpoints and weight loading all
narrow, flatten and copy plain tensors; here every parameter is a plain tensor of its local
shape and every input and output a plain full tensor.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from spindle_dsl.errors import ExecutionError
from spindle_dsl.kinds.layers import (
    EmbeddingStage,
    FeedForward,
    LMHead,
    MlpLayer,
    RMSNorm,
    SelfAttentionBlock,
    SwiGLUFeedForward,
)
from spindle_dsl.kinds.tower_layers import TailedBlock
from spindle_dsl.kinds.tp_split import (
    TpLayout,
    block_layout,
    embedding_layout,
    ffn_layout,
    head_layout,
    mlp_layout,
    slices,
    split_state,
)

from .tp_layers import (
    Group,
    TpEmbeddingStage,
    TpLMHead,
    TpMlpLayer,
    TpSelfAttentionBlock,
    feed_forward,
)

__all__ = ["ShardView", "layout_of", "shard_layer", "tp_groups"]

# --- from a full layer to a rank's module ----------------------------------------------------


def _norm_of(layer: nn.Module) -> tuple[str, float]:
    return ("rmsnorm" if isinstance(layer, RMSNorm) else "layernorm", float(layer.eps))


def layout_of(layer: nn.Module) -> TpLayout:
    """The layout of a built-in layer (exact types: a subclass may compute something else)."""
    kind = type(layer)
    if kind in (SelfAttentionBlock, TailedBlock):
        return block_layout(layer.shape)
    if kind in (FeedForward, SwiGLUFeedForward):
        return ffn_layout(
            layer.fc2.in_features, kind is SwiGLUFeedForward, layer.fc1.bias is not None
        )
    if kind is MlpLayer:
        if isinstance(layer.net, nn.Linear):
            return mlp_layout(layer.net.in_features, layer.net.out_features, None)
        first, last = layer.net[0], layer.net[2]
        return mlp_layout(first.in_features, last.out_features, first.out_features)
    if kind is LMHead:
        return head_layout(None if layer.out is None else layer.out.out_features)
    if kind is EmbeddingStage:
        return embedding_layout(layer.embed.num_embeddings)
    raise ExecutionError(
        f"{kind.__name__} has no tensor-parallel form: only the built-in self-attention "
        f"blocks, feed-forward nets, mlp layers, LM heads and token embeddings split"
    )


def _skeleton(layer: nn.Module, tp: int, tp_rank: int, group: Group) -> nn.Module:
    """The rank's module with parameters of the local shapes on the meta device (no memory;
    ``shard_layer`` assigns the shard's tensors)."""
    kind, comm = type(layer), (tp, tp_rank, group)
    if kind in (SelfAttentionBlock, TailedBlock):
        if kind is TailedBlock:
            tail = copy.deepcopy(layer.tail).to("meta")
            return TpSelfAttentionBlock(layer.shape, layer.causal, None, *comm, tail, layer.pool_to)
        return TpSelfAttentionBlock(layer.shape, layer.causal, layer.out_tokens, *comm)
    if kind in (FeedForward, SwiGLUFeedForward):
        act = getattr(layer, "act", "swiglu")
        bias = layer.fc1.bias is not None
        return feed_forward(layer.fc1.in_features, layer.fc2.in_features, bias, act, *comm)
    if kind is MlpLayer:
        n_in, n_out, hidden = _mlp_widths(layer)
        return TpMlpLayer(n_in, n_out, hidden, layer.out_tokens, *comm)
    if kind is LMHead:
        norm, eps = _norm_of(layer.ln)
        rows = 1 if layer.out is None else layer.out.out_features // tp
        return TpLMHead(layer.ln.weight.shape[0], rows, norm, layer.out is None, eps, *comm)
    # EmbeddingStage (layout_of refused every other kind)
    vocab, width = layer.embed.num_embeddings, layer.embed.embedding_dim
    learned = layer.pos is not None
    tokens = layer.pos.shape[0] if learned else 1
    return TpEmbeddingStage(vocab // tp, tokens, width, learned, *comm)


def _mlp_widths(layer: MlpLayer) -> tuple[int, int, int | None]:
    if isinstance(layer.net, nn.Linear):
        return layer.net.in_features, layer.net.out_features, None
    return layer.net[0].in_features, layer.net[2].out_features, layer.net[0].out_features


def shard_layer(layer: nn.Module, tp_rank: int, tp: int, group: Group = None) -> nn.Module:
    """The module rank ``tp_rank`` of a ``tp``-rank tensor-parallel ``group`` runs in place of
    the built-in ``layer``: the same inputs (whole rows, the same padding mask) and the same
    full output on every rank, holding this rank's shard of ``layer``'s weights (new tensors
    of ``layer``'s dtype and device; frozen parameters stay frozen).

    Raises ``ExecutionError`` for a layer with no tensor-parallel form, a degree its heads,
    K/V heads or widths do not divide, or a group of another size. A tied LM head must then
    be ``tie_to`` the sharded embedding stage of the same rank."""
    state = split_state(layer.state_dict(), tp_rank, tp, layout_of(layer))  # checks tp
    if dist.is_available() and dist.is_initialized() and tp > 1:
        size, mine = dist.get_world_size(group), dist.get_rank(group)
        if (size, mine) != (tp, tp_rank):
            raise ExecutionError(
                f"tensor-parallel rank {tp_rank} of {tp} is rank {mine} of a group of {size}"
            )
    with torch.device("meta"):
        module = _skeleton(layer, tp, tp_rank, group)
    module.load_state_dict(state, strict=True, assign=True)
    frozen = {name for name, p in layer.named_parameters() if not p.requires_grad}
    for name, p in module.named_parameters():
        p.grad = None  # a copied tail brings none of the full layer's gradients
        p.requires_grad_(name not in frozen)
    return module


# --- a rank's slice of a layer it holds whole ----------------------------------------------------


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``factor`` backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


class ShardView(nn.Module):
    """Rank ``tp_rank``'s tensor-parallel slice of a built-in layer that the rank holds whole.

    The runtime keeps every layer whole on each rank of a tensor-parallel group (its
    parameters are the model's, so gradient reduction, ZeRO sharding, checkpoints, weight
    loading and export work on them as on any other) and runs each rank's slice of it through
    this view: every forward slices the split parameters out of the whole ones (``tp_split``'s
    layout) and calls the ``shard_layer`` module on them, so the rank computes and
    communicates exactly as a sharded layer does. After backward a rank's gradient of a split
    parameter is non-zero in its own slice only, and its gradient of a replicated parameter
    is scaled by ``1 / tp``: every rank of the group computes that whole gradient from the
    same rows, so the sum over the parameter's holders counts each group once, and the usual
    reduction over the holders gives every rank the gradient of the full layer.
    """

    def __init__(self, full: nn.Module, tp_rank: int, tp: int, group: Group):
        super().__init__()
        self.layout = layout_of(full)
        problem = self.layout.problem(tp)
        if problem is not None:
            raise ExecutionError(f"cannot split a {self.layout.what} {tp}-way: {problem}")
        with torch.device("meta"):
            skeleton = _skeleton(full, tp, tp_rank, group)
        # neither is a submodule: the view owns no parameters of its own
        self._parts = (full, skeleton)
        self.tp, self.tp_rank = tp, tp_rank
        self.takes_mask = getattr(full, "takes_mask", False)

    def _tensors(self) -> dict[str, torch.Tensor]:
        full, _ = self._parts
        out: dict[str, torch.Tensor] = {}
        for name, t in full.state_dict(keep_vars=True).items():
            split = self.layout.split_of(name)
            if split is not None:
                out[name] = slices(t, split, self.tp_rank, self.tp)
            elif t.requires_grad:
                out[name] = _ScaleGrad.apply(t, 1.0 / self.tp)
            else:
                out[name] = t
        return out

    def forward(self, *args: Any) -> torch.Tensor:
        _, skeleton = self._parts
        return torch.func.functional_call(skeleton, self._tensors(), args)


def tp_groups(stage_groups: Any, rank: int) -> dict[tuple[int, ...], Group]:
    """A process group per tensor-parallel group of ranks (``stage_groups``: every stage's
    groups of more than one rank), for the groups ``rank`` is in. A collective: every rank
    creates every group in the same sorted order, as ``new_group`` requires."""
    out: dict[tuple[int, ...], Group] = {}
    for ranks in sorted(set(stage_groups)):
        group = dist.new_group(list(ranks))
        if rank in ranks:
            out[ranks] = group
    return out
