"""The PyTorch modules behind the built-in kinds (imported only when a layer is built).

Every module maps ``(batch, tokens, width)`` to ``(batch, tokens', width')``. Their parameter
counts are pinned by the tests to the closed forms in ``common.py``, which the cost model uses,
so what the planner prices is exactly what the runtime trains.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spindle_dsl.kinds.common import BlockShape, RopeScaling, default_norm_eps


def pool_tokens(
    x: torch.Tensor, out_tokens: int | None, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Adaptive average pooling along the token axis; a no-op when already ``out_tokens`` long.
    ``mask`` (batch, tokens), True at real tokens: each row pools its real tokens alone, as
    adaptive pooling pools a row of just those (pooled token ``o`` of ``n`` real ones averages
    the real tokens ranked ``floor(o n / out)`` to ``ceil((o + 1) n / out) - 1``)."""
    if out_tokens is None or x.shape[1] == out_tokens:
        return x
    if mask is None:
        return F.adaptive_avg_pool1d(x.transpose(1, 2), out_tokens).transpose(1, 2)
    rank = (mask.long().cumsum(1) - 1)[:, None, :]  # (batch, 1, tokens)
    n = mask.long().sum(1)[:, None, None]
    o = torch.arange(out_tokens, device=x.device)[None, :, None]  # (1, out, 1)
    first, end = o * n // out_tokens, -(-(o + 1) * n // out_tokens)
    inside = mask[:, None, :] & (rank >= first) & (rank < end)  # (batch, out, tokens)
    weights = inside.to(x.dtype)
    return (weights / weights.sum(-1, keepdim=True).clamp_min(1.0)) @ x


def activate(x: torch.Tensor, act: str) -> torch.Tensor:
    """The feed-forward nonlinearity ``act`` (``common.ACTIVATIONS``, swiglu aside)."""
    if act == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    return F.gelu(x, approximate="tanh" if act == "gelu_tanh" else "none")


class FeedForward(nn.Module):
    """Linear(width, ffn) - GELU (or ``act``) - Linear(ffn, width)."""

    def __init__(self, width: int, ffn: int, bias: bool = True, act: str = "gelu"):
        super().__init__()
        self.act = act
        self.fc1 = nn.Linear(width, ffn, bias=bias)
        self.fc2 = nn.Linear(ffn, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(activate(self.fc1(x), self.act))


class SwiGLUFeedForward(nn.Module):
    """SiLU(x W_gate) * (x W_up), then W_down; gate and up are one fused Linear(width, 2 ffn)
    (gate first), so the layer is two matmuls as the GELU one is."""

    def __init__(self, width: int, ffn: int, bias: bool = True, act: str = "swiglu"):
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * ffn, bias=bias)
        self.fc2 = nn.Linear(ffn, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(F.silu(gate) * up)


class RMSNorm(nn.Module):
    """x / rms(x) * weight (no mean subtraction, no bias), computed in float32 at least."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def make_norm(norm: str, width: int, eps: float | None = None) -> nn.Module:
    eps = default_norm_eps(norm) if eps is None else eps
    if norm == "rmsnorm":
        return RMSNorm(width, eps)
    if norm == "layernorm":
        return nn.LayerNorm(width, eps=eps)
    raise ValueError(f"unknown norm {norm!r}")


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, w = x.shape
    return x.view(b, t, heads, w // heads).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def rope_frequencies(
    half: int, theta: float, scaling: RopeScaling | None, device: torch.device
) -> torch.Tensor:
    """The ``half`` rotary frequencies ``theta ** (-2i / (2 half))`` in float64, rescaled as
    Llama 3.1 does where ``scaling`` says (see ``common.RopeScaling``)."""
    freq = theta ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
    if scaling is None:
        return freq
    wavelength = 2 * torch.pi / freq
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    # 0 where the wavelength is long (divide by the factor), 1 where short (keep), linear in
    # original_max / wavelength between
    keep = ((scaling.original_max / wavelength - low) / (high - low)).clamp(0.0, 1.0)
    return freq / scaling.factor * (1.0 - keep) + freq * keep


def rotate(x: torch.Tensor, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """Rotary position embedding of (batch, heads, tokens, head_dim): the two halves of each
    head are the real and imaginary parts rotated by position x frequency (GPT-NeoX/LLaMA
    layout), frequencies ``theta ** (-2i / head_dim)`` (``rope_frequencies``), positions
    0..tokens-1."""
    t, d = x.shape[-2], x.shape[-1]
    half = d // 2
    freq = rope_frequencies(half, theta, scaling, x.device)
    angle = torch.arange(t, dtype=torch.float64, device=x.device)[:, None] * freq[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention where k/v may have fewer heads than q (grouped-query):
    each K/V head serves ``q_heads / kv_heads`` consecutive query heads. ``mask`` (batch,
    tokens), True at real tokens: a padded token attends only to itself, and no token attends
    to one."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=padding_mask(mask, causal))


def padding_mask(mask: torch.Tensor, causal: bool) -> torch.Tensor:
    """(batch, 1, tokens, tokens) booleans for ``scaled_dot_product_attention``: query i sees
    key j where both are real (and j <= i if ``causal``), and always itself."""
    t = mask.shape[1]
    seen = mask[:, None, None, :] & mask[:, None, :, None]
    if causal:
        seen = seen & torch.ones(t, t, dtype=torch.bool, device=mask.device).tril()
    return seen | torch.eye(t, dtype=torch.bool, device=mask.device)


class SelfAttentionBlock(nn.Module):
    """Pre-norm transformer block (``BlockShape``); optionally causal; optionally pools tokens
    at the end; takes a padding mask (``backends/torch/masks.py``)."""

    takes_mask = True

    def __init__(self, shape: BlockShape, causal: bool, out_tokens: int | None):
        super().__init__()
        h = shape.hidden
        assert shape.head_width or h % shape.heads == 0, f"hidden {h} not divisible by heads"
        assert shape.heads % shape.kv_heads == 0, "kv_heads must divide heads"
        self.shape, self.causal, self.out_tokens = shape, causal, out_tokens
        self.ln1 = make_norm(shape.norm, h, shape.eps)
        # q and v biases without one on k (Whisper) are held apart from the fused weight
        k_free = shape.qkv_bias and not shape.has_k_bias
        self.qkv = nn.Linear(h, shape.qkv_width, bias=shape.qkv_bias and not k_free)
        if k_free:
            self.q_bias = nn.Parameter(torch.zeros(shape.q_width))
            self.v_bias = nn.Parameter(torch.zeros(shape.kv_width))
        self.proj = nn.Linear(shape.q_width, h, bias=shape.has_out_bias)
        self.ln2 = make_norm(shape.norm, h, shape.eps)
        ffn = SwiGLUFeedForward if shape.act == "swiglu" else FeedForward
        self.ffn = ffn(h, shape.ffn, bias=shape.bias, act=shape.act)

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "q_bias"):
            return self.qkv(x)
        k_zero = self.q_bias.new_zeros(self.shape.kv_width)
        return F.linear(x, self.qkv.weight, torch.cat((self.q_bias, k_zero, self.v_bias)))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        s = self.shape
        kv_width = s.kv_width
        q, k, v = self._qkv(self.ln1(x)).split((s.q_width, kv_width, kv_width), dim=-1)
        q, k, v = _split_heads(q, s.heads), _split_heads(k, s.kv_heads), _split_heads(v, s.kv_heads)
        if s.rotary:
            q = rotate(q, s.rope_theta, s.rope_scaling)
            k = rotate(k, s.rope_theta, s.rope_scaling)
        y = (
            attention(q, k, v, self.causal)
            if mask is None
            else attention(q, k, v, self.causal, mask)
        )
        x = x + self.proj(_merge_heads(y))
        x = x + self.ffn(self.ln2(x))
        return pool_tokens(x, self.out_tokens, mask)


class MlpLayer(nn.Module):
    """Linear(in, hidden)-GELU-Linear(hidden, out), or Linear(in, out) without ``hidden``."""

    takes_mask = True  # per token; the mask matters only to its pooling

    def __init__(self, n_in: int, n_out: int, hidden: int | None, out_tokens: int | None):
        super().__init__()
        self.out_tokens = out_tokens
        if hidden is None:
            self.net: nn.Module = nn.Linear(n_in, n_out)
        else:
            self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.GELU(), nn.Linear(hidden, n_out))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return pool_tokens(self.net(x), self.out_tokens, mask)


class ResamplerLayer(nn.Module):
    """Learned queries cross-attend to the inputs (their real tokens, with a mask), then a
    feed-forward; out_tokens x hidden."""

    takes_mask = True

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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        kv = self.ln_kv(x)
        base = self.queries.unsqueeze(0).expand(x.shape[0], -1, -1)
        q = _split_heads(self.q(self.ln_q(base)), self.heads)
        k = _split_heads(self.k(kv), self.heads)
        v = _split_heads(self.v(kv), self.heads)
        keys = None if mask is None else (mask | ~mask.any(1, keepdim=True))[:, None, None, :]
        y = base + self.proj(_merge_heads(F.scaled_dot_product_attention(q, k, v, keys)))
        return y + self.ffn(self.ln2(y))


class _PositionTable(nn.Module):
    """A learned (tokens, width) position table added to the first ``t`` tokens of the input;
    with ``learned`` off (rotary positions, applied in the blocks) there is no table."""

    def __init__(self, tokens: int, width: int, learned: bool = True):
        super().__init__()
        if learned:
            self.pos = nn.Parameter(torch.randn(tokens, width) * 0.02)
        else:
            self.pos = None

    def add_positions(self, x: torch.Tensor) -> torch.Tensor:
        if self.pos is None:
            return x
        t = x.shape[1]
        if t > self.pos.shape[0]:
            raise ValueError(
                f"input has {t} tokens but the position table holds {self.pos.shape[0]}"
            )
        return x + self.pos[:t]


class EmbeddingStage(_PositionTable):
    """Token ids (batch, tokens) -> Embedding(vocab, width) + positions.

    An embedding an LM head is ``tied`` to starts at standard deviation 1/sqrt(width) instead
    of torch's 1: the head's logits are a normalised hidden state (norm ~ sqrt(width)) times
    an embedding row, so they start near unit scale rather than ~sqrt(width), where the first
    steps would only undo the initialisation."""

    def __init__(
        self, vocab: int, tokens: int, width: int, learned: bool = True, tied: bool = False
    ):
        super().__init__(tokens, width, learned)
        self.embed = nn.Embedding(vocab, width)
        if tied:
            nn.init.normal_(self.embed.weight, std=width**-0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.add_positions(self.embed(ids))


class LinearStage(_PositionTable):
    """Feature vectors or flattened pixel patches (batch, tokens, n_in) -> Linear + positions."""

    def __init__(self, n_in: int, tokens: int, width: int, learned: bool = True, bias: bool = True):
        super().__init__(tokens, width, learned)
        self.proj = nn.Linear(n_in, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add_positions(self.proj(x))


class LMHead(nn.Module):
    """A final norm, then Linear(hidden, vocab, bias=False): next-token logits.

    A tied head (``tied``) has no matrix of its own: it multiplies by the token embedding of
    its module's input stage (an ``EmbeddingStage``), which whoever builds the parts hands it
    with ``tie_to``; the stage is kept outside the head's parameters, so it is owned, reduced
    and saved once, as part of the stage."""

    def __init__(
        self,
        hidden: int,
        vocab: int,
        norm: str = "layernorm",
        tied: bool = False,
        eps: float | None = None,
    ):
        super().__init__()
        self.ln = make_norm(norm, hidden, eps)
        self.out = None if tied else nn.Linear(hidden, vocab, bias=False)
        self._tied: list[EmbeddingStage] = []  # a list, so the stage is not a submodule

    def tie_to(self, stage: EmbeddingStage) -> None:
        self._tied[:] = [stage]

    @property
    def weight(self) -> torch.Tensor:
        """The (vocab, hidden) matrix the logits multiply by: its own or the tied embedding."""
        if self.out is not None:
            return self.out.weight
        if not self._tied:
            raise RuntimeError("a tied LM head was built without its token embedding")
        return self._tied[0].embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(x)

    def logits(self, x: torch.Tensor, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """The logits of vocabulary entries ``[lo, hi)`` (all by default): a slice of the
        matrix, so its gradient lands in those rows of the whole one."""
        weight = self.weight if lo == 0 and hi is None else self.weight[lo:hi]
        return F.linear(self.ln(x), weight)
