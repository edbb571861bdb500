"""The PyTorch modules behind the built-in kinds (imported only when a layer is built).

Every module maps ``(batch, tokens, width)`` to ``(batch, tokens', width')``. Their parameter
counts are pinned by the tests to the closed forms in ``common.py``, which the cost model uses,
so what the planner prices is exactly what the runtime trains.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def pool_tokens(x: torch.Tensor, out_tokens: int | None) -> torch.Tensor:
    """Adaptive average pooling along the token axis; a no-op when already ``out_tokens`` long."""
    if out_tokens is None or x.shape[1] == out_tokens:
        return x
    return F.adaptive_avg_pool1d(x.transpose(1, 2), out_tokens).transpose(1, 2)


class FeedForward(nn.Module):
    """Linear(width, ffn) - GELU - Linear(ffn, width)."""

    def __init__(self, width: int, ffn: int):
        super().__init__()
        self.fc1 = nn.Linear(width, ffn)
        self.fc2 = nn.Linear(ffn, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, w = x.shape
    return x.view(b, t, heads, w // heads).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


class SelfAttentionBlock(nn.Module):
    """Pre-LN transformer block; optionally causal; optionally pools tokens at the end."""

    def __init__(self, hidden: int, heads: int, ffn: int, causal: bool, out_tokens: int | None):
        super().__init__()
        assert hidden % heads == 0, f"hidden {hidden} not divisible by heads {heads}"
        self.heads, self.causal, self.out_tokens = heads, causal, out_tokens
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.ffn = FeedForward(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (_split_heads(t, self.heads) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(_merge_heads(attn))
        x = x + self.ffn(self.ln2(x))
        return pool_tokens(x, self.out_tokens)


class MlpLayer(nn.Module):
    """Linear(in, hidden)-GELU-Linear(hidden, out), or Linear(in, out) without ``hidden``."""

    def __init__(self, n_in: int, n_out: int, hidden: int | None, out_tokens: int | None):
        super().__init__()
        self.out_tokens = out_tokens
        if hidden is None:
            self.net: nn.Module = nn.Linear(n_in, n_out)
        else:
            self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.GELU(), nn.Linear(hidden, n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pool_tokens(self.net(x), self.out_tokens)


class ResamplerLayer(nn.Module):
    """Learned queries cross-attend to the inputs, then a feed-forward; out_tokens x hidden."""

    def __init__(self, n_in: int, hidden: int, heads: int, out_tokens: int, ffn: int):
        super().__init__()
        assert hidden % heads == 0, f"hidden {hidden} not divisible by heads {heads}"
        self.heads = heads
        self.queries = nn.Parameter(torch.randn(out_tokens, hidden) * 0.02)
        self.ln_q = nn.LayerNorm(hidden)
        self.ln_kv = nn.LayerNorm(n_in)
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(n_in, hidden)
        self.v = nn.Linear(n_in, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.ffn = FeedForward(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv = self.ln_kv(x)
        base = self.queries.unsqueeze(0).expand(x.shape[0], -1, -1)
        q = _split_heads(self.q(self.ln_q(base)), self.heads)
        k = _split_heads(self.k(kv), self.heads)
        v = _split_heads(self.v(kv), self.heads)
        y = base + self.proj(_merge_heads(F.scaled_dot_product_attention(q, k, v)))
        return y + self.ffn(self.ln2(y))


class _PositionTable(nn.Module):
    """A learned (tokens, width) position table added to the first ``t`` tokens of the input."""

    def __init__(self, tokens: int, width: int):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(tokens, width) * 0.02)

    def add_positions(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if t > self.pos.shape[0]:
            raise ValueError(
                f"input has {t} tokens but the position table holds {self.pos.shape[0]}"
            )
        return x + self.pos[:t]


class EmbeddingStage(_PositionTable):
    """Token ids (batch, tokens) -> Embedding(vocab, width) + positions."""

    def __init__(self, vocab: int, tokens: int, width: int):
        super().__init__(tokens, width)
        self.embed = nn.Embedding(vocab, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.add_positions(self.embed(ids))


class LinearStage(_PositionTable):
    """Feature vectors or flattened pixel patches (batch, tokens, n_in) -> Linear + positions."""

    def __init__(self, n_in: int, tokens: int, width: int):
        super().__init__(tokens, width)
        self.proj = nn.Linear(n_in, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add_positions(self.proj(x))


class LMHead(nn.Module):
    """LayerNorm then Linear(hidden, vocab, bias=False): next-token logits."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))
