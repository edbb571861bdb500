"""The PyTorch modules of the pieces around a stack of blocks (``tower.py`` says what each is
and counts it): input stages with a CLS token, an embedding norm, Whisper's convolution stem
or fixed sinusoidal positions, and the tail of a module's last layer (a final norm, a pooling
head, the choice of output). Imported only when a layer is built.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from spindle_dsl.kinds.common import BlockShape
from spindle_dsl.kinds.layers import (
    FeedForward,
    SelfAttentionBlock,
    _merge_heads,
    _split_heads,
    make_norm,
    pool_tokens,
)
from spindle_dsl.kinds.tower import Tail


def sinusoids(length: int, width: int) -> torch.Tensor:
    """Whisper's fixed positions: row p is ``sin(p w_i)`` for the first half of the channels
    and ``cos(p w_i)`` for the second, ``w_i = 10000 ** (-i / (width / 2 - 1))``."""
    half = width // 2
    rate = math.log(10000.0) / (half - 1)
    freq = torch.exp(-rate * torch.arange(half, dtype=torch.float64))
    angle = torch.arange(length, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cat((angle.sin(), angle.cos()), dim=1).to(torch.float32)


def position_table(tokens: int, width: int, pos: str) -> nn.Parameter | None:
    """A learned table, a fixed sinusoidal one (a parameter that takes no gradient, so that a
    pretrained file's table loads as the learned ones do), or none (rotary positions)."""
    if pos == "learned":
        return nn.Parameter(torch.randn(tokens, width) * 0.02)
    if pos == "sinusoidal":
        return nn.Parameter(sinusoids(tokens, width), requires_grad=False)
    return None


def _add_positions(x: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
    if pos is None:
        return x
    if x.shape[1] > pos.shape[0]:
        raise ValueError(f"input has {x.shape[1]} tokens but the position table holds {len(pos)}")
    return x + pos[: x.shape[1]]


class PatchStage(nn.Module):
    """Flattened pixel patches (batch, tokens, 3 p p) -> Linear, a CLS token in front
    (``cls``), the learned positions (one more row with a CLS token), a norm (``norm``)."""

    def __init__(
        self,
        n_in: int,
        tokens: int,
        width: int,
        bias: bool,
        cls: bool,
        norm: str | None,
        eps: float | None,
    ):
        super().__init__()
        self.proj = nn.Linear(n_in, width, bias=bias)
        self.cls = nn.Parameter(torch.randn(width) * 0.02) if cls else None
        self.pos = nn.Parameter(torch.randn(tokens + int(cls), width) * 0.02)
        self.norm = make_norm(norm, width, eps) if norm is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        if self.cls is not None:
            x = torch.cat((self.cls.expand(x.shape[0], 1, -1), x), dim=1)
        x = _add_positions(x, self.pos)
        return self.norm(x) if self.norm is not None else x


class FeatureStage(nn.Module):
    """Feature vectors (batch, frames, n_in) -> a linear layer, or Whisper's stem
    (``stem = "conv"``: Conv1d(n_in, width, 3) - GELU - Conv1d(width, width, 3, stride 2) -
    GELU, every convolution padded by 1), then learned, sinusoidal or no positions (a table
    of ``rows``, the tokens after the stem at least)."""

    def __init__(self, n_in: int, rows: int, width: int, bias: bool, stem: str, pos: str):
        super().__init__()
        self.stem = stem
        if stem == "conv":
            self.conv1 = nn.Conv1d(n_in, width, 3, padding=1, bias=bias)
            self.conv2 = nn.Conv1d(width, width, 3, stride=2, padding=1, bias=bias)
        else:
            self.proj = nn.Linear(n_in, width, bias=bias)
        self.pos = position_table(rows, width, pos)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stem == "conv":
            x = F.gelu(self.conv1(x.transpose(1, 2)))
            x = F.gelu(self.conv2(x)).transpose(1, 2)
        else:
            x = self.proj(x)
        return _add_positions(x, self.pos)


class AttentionPool(nn.Module):
    """Multi-head attention pooling (SigLIP's head): one learned query attends to every
    token (a fused q/k/v projection laid out as torch's MultiheadAttention lays it out), then
    a residual norm and feed-forward net: (batch, tokens, h) -> (batch, 1, h)."""

    def __init__(self, tail: Tail, act: str, eps: float | None):
        super().__init__()
        h = tail.hidden
        self.heads = tail.heads
        self.probe = nn.Parameter(torch.randn(h) * 0.02)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.norm = make_norm(tail.norm, h, eps)
        self.ffn = FeedForward(h, tail.ffn, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1]
        w, b = self.qkv.weight, self.qkv.bias
        q = F.linear(self.probe.expand(x.shape[0], 1, h), w[:h], b[:h])
        k, v = F.linear(x, w[h:], b[h:]).chunk(2, dim=-1)
        q, k, v = (_split_heads(y, self.heads) for y in (q, k, v))
        y = self.proj(_merge_heads(F.scaled_dot_product_attention(q, k, v)))
        return y + self.ffn(self.norm(y))


class TowerTail(nn.Module):
    """The tail of a module's last layer (``tower.Tail``): the final norm, then the output."""

    def __init__(self, tail: Tail, act: str, eps: float | None):
        super().__init__()
        self.output, self.cls = tail.output, tail.cls
        self.norm = make_norm(tail.norm, tail.hidden, eps) if tail.final_norm else None
        self.pool: nn.Module | None = None
        if tail.pool == "norm":
            self.pool = make_norm(tail.norm, tail.hidden, eps)
        elif tail.pool == "dense":
            self.pool = nn.Linear(tail.hidden, tail.hidden)
        elif tail.pool == "map":
            self.pool = AttentionPool(tail, act, eps)
        self.kind = tail.pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        if self.output == "tokens":
            return x
        if self.output == "patches":
            return x[:, 1:] if self.cls else x
        if self.output == "cls":
            return x[:, :1]
        assert self.pool is not None, "a pooled output needs a pool (the kind checks it)"
        if self.kind == "map":
            return self.pool(x)
        y = self.pool(x[:, :1])
        return torch.tanh(y) if self.kind == "dense" else y


class TailedBlock(SelfAttentionBlock):
    """A module's last block followed by its tail, then the ``out_tokens`` pooling."""

    def __init__(
        self,
        shape: BlockShape,
        causal: bool,
        out_tokens: int | None,
        tail: Tail,
    ):
        super().__init__(shape, causal, None)
        self.tail = TowerTail(tail, shape.act, shape.eps)
        self.pool_to = out_tokens

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return pool_tokens(self.tail(super().forward(x, *args, **kwargs)), self.pool_to)
