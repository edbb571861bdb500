"""Pieces the built-in kinds share: argument specs, the input-stage rules and cost formulas.

The built-in kinds are all made of the same few parts (pre-norm attention blocks and their
variants, feed-forward nets, linear or embedding input stages with an optional learned position
table). Writing each part's parameter and FLOP formula once here keeps the four kinds
consistent with each other and with the PyTorch layers in ``layers.py``, which the tests count
against these.

Conventions (every count is per sample and per layer):
- FLOPs are 2 per multiply-accumulate of the matmuls, including attention scores (QK^T) and
  attention-weighted values (AV). Attention is counted over the full sequence even when causal
  (a dense kernel computes it all). Norms, softmax, GELU/SiLU and the SwiGLU product, rotary
  rotations, biases and residual adds are left out: they are O(tokens x width), below 1% of
  the matmuls at any realistic width.
- Activation elements are the tensors one layer's forward saves for its backward, exactly as
  autograd keeps them with torch's fused attention (its log-sum-exp, never the heads x q x k
  softmax probabilities); ``tests/kinds/test_saved_activations.py`` measures every kind and
  block variant against these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from spindle_dsl.kinds.base import Args, ArgSpec

if TYPE_CHECKING:
    from spindle_dsl.metagraph import ModalityInfo

OUT_TOKENS = ArgSpec(
    "out_tokens",
    int,
    None,
    doc="tokens per sample out; the module's last layer average-pools its tokens to this many",
)


def ffn_default(resolved: dict) -> int:
    """``ffn = 4 * hidden``: the feed-forward width of GPT/ViT blocks."""
    return 4 * int(resolved["hidden"])


# --- parameters -----------------------------------------------------------------------------


def layernorm_params(width: int) -> int:
    return 2 * width  # weight and bias


def norm_params(norm: str, width: int) -> int:
    """LayerNorm keeps a weight and a bias, RMSNorm a weight only."""
    return 2 * width if norm == "layernorm" else width


def linear_params(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def ffn_params(hidden: int, ffn: int) -> int:
    """Linear(hidden, ffn) - GELU - Linear(ffn, hidden), both with bias."""
    return linear_params(hidden, ffn) + linear_params(ffn, hidden)


# --- FLOPs ----------------------------------------------------------------------------------


def matmul_flops(rows: int, n_in: int, n_out: int) -> float:
    """A (rows x n_in) @ (n_in x n_out) product: 2 FLOPs per multiply-accumulate."""
    return 2.0 * rows * n_in * n_out


# --- the self-attention block and its variants -----------------------------------------------

# gelu: exact (erf); gelu_tanh: its tanh approximation (SigLIP, GPT-2's "gelu_new");
# quick_gelu: x * sigmoid(1.702 x) (CLIP); swiglu: the gated SiLU feed-forward (LLaMA)
ACTIVATIONS = ("gelu", "swiglu", "quick_gelu", "gelu_tanh")
NORMS = ("layernorm", "rmsnorm")
# sinusoidal: a fixed (untrained) sine/cosine table added to the input, as Whisper's encoder
POSITIONS = ("learned", "rotary", "sinusoidal")
ROPE_SCALINGS = ("none", "llama3")


def default_norm_eps(norm: str) -> float:
    """The epsilon a norm gets unless the spec says: 1e-6 for RMSNorm, torch's 1e-5 for
    LayerNorm."""
    return 1e-6 if norm == "rmsnorm" else 1e-5


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's rotary frequency scaling: frequencies whose wavelength exceeds
    ``original_max / low_freq_factor`` are divided by ``factor``, those below
    ``original_max / high_freq_factor`` kept, and the band between interpolated."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max: int


@dataclass(frozen=True)
class BlockShape:
    """One pre-norm self-attention block, resolved from a kind's arguments.

    The default (GELU, LayerNorm, every linear with a bias, as many K/V heads as query heads)
    is the GPT-2/ViT block; the variants are the LLaMA/Qwen ones: SwiGLU feed-forward (gate and
    up projections, then down), RMSNorm, grouped-query attention (``kv_heads`` K/V heads, each
    shared by ``heads / kv_heads`` query heads), no biases, or biases on q/k/v only, and
    rotary positions (parameter-free, applied to q and k inside the block). The parameter,
    FLOP and activation formulas below are what the tests pin to the PyTorch layer.
    """

    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    act: str = "gelu"
    norm: str = "layernorm"
    bias: bool = True  # the feed-forward linears (and the output projection unless out_bias)
    qkv_bias: bool = True  # the q/k/v projection
    rotary: bool = False
    rope_theta: float = 10000.0
    norm_eps: float | None = None  # None: default_norm_eps(norm)
    head_width: int | None = None  # channels per head; None: hidden / heads
    k_bias: bool | None = None  # a bias on k (None: qkv_bias); Whisper has none
    out_bias: bool | None = None  # a bias on the output projection (None: bias)
    rope_scaling: RopeScaling | None = None

    @property
    def head_dim(self) -> int:
        return self.head_width or self.hidden // self.heads

    @property
    def eps(self) -> float:
        return default_norm_eps(self.norm) if self.norm_eps is None else self.norm_eps

    @property
    def q_width(self) -> int:
        """Width of all query heads together (the attention's inner width)."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def has_k_bias(self) -> bool:
        return self.qkv_bias if self.k_bias is None else self.k_bias

    @property
    def has_out_bias(self) -> bool:
        return self.bias if self.out_bias is None else self.out_bias

    @property
    def qkv_width(self) -> int:
        """Output width of the fused q/k/v projection: all query heads, then K and V heads."""
        return self.q_width + 2 * self.kv_width

    @property
    def qkv_bias_params(self) -> int:
        """Biases of the q/k/v projection: q and v (and k unless it has none)."""
        if not self.qkv_bias:
            return 0
        return self.q_width + self.kv_width + (self.kv_width if self.has_k_bias else 0)

    @property
    def ffn_in_width(self) -> int:
        """Output width of the first feed-forward linear (SwiGLU fuses gate and up)."""
        return 2 * self.ffn if self.act == "swiglu" else self.ffn

    def params(self) -> int:
        h = self.hidden
        return (
            2 * norm_params(self.norm, h)
            + h * self.qkv_width
            + self.qkv_bias_params
            + linear_params(self.q_width, h, self.has_out_bias)
            + linear_params(h, self.ffn_in_width, self.bias)
            + linear_params(self.ffn, h, self.bias)
        )

    def flops(self, tokens: int) -> float:
        t, h, q = tokens, self.hidden, self.q_width
        return (
            matmul_flops(t, h, self.qkv_width)  # q, k and v projections
            + matmul_flops(t, q, t)  # scores QK^T, all query heads together
            + matmul_flops(t, t, q)  # probabilities x V
            + matmul_flops(t, q, h)  # output projection
            + matmul_flops(t, h, self.ffn_in_width)
            + matmul_flops(t, self.ffn, h)
        )

    def activations(self, tokens: int) -> float:
        """What autograd saves for backward in one block, per sample: measured with
        ``saved_tensors_hooks`` for every variant (``tests/kinds/test_saved_activations.py``
        pins it exactly, fp32 and fp64, torch's fused CPU attention)."""
        t, h, f, q = tokens, self.hidden, self.ffn, self.q_width
        gqa = self.kv_heads != self.heads
        # The block input, norm 1's output (qkv in), norm 2's input and output (fc1 in): 4th.
        # LayerNorm keeps its mean and 1/std (2t); RMSNorm its 1/rms (t) and the normalised
        # tensor before the weight (th).
        kept = 4.0 * t * h
        kept += 2.0 * (2.0 * t if self.norm == "layernorm" else t * h + t)
        # The fused q/k/v output stays alive through the views attention saves, unless GQA
        # repeats k and v and rotary replaces q (nothing then views it).
        if not (gqa and self.rotary):
            kept += t * self.qkv_width
        if self.rotary:
            # the rotated q (and k, unless GQA repeats it below) are new tensors; attention's
            # output is then laid out per head, so merging the heads copies it (proj in)
            kept += 2.0 * t * q + (0.0 if gqa else t * self.kv_width)
        if gqa:
            kept += 2.0 * t * q  # k and v repeated to every query head
        # The attention output and the fused kernel's log-sum-exp (heads x t): never the
        # t x t probabilities.
        kept += t * q + float(self.heads) * t
        # GELU (exact or tanh) keeps its input and output (fc2 in): 2tf; quick GELU also its
        # sigmoid: 3tf; SwiGLU keeps gate and up (one fused output, 2tf), the SiLU output and
        # the product (fc2 in): 4tf.
        kept += {"swiglu": 4.0, "quick_gelu": 3.0}.get(self.act, 2.0) * t * f
        return kept

    def batch_free_activations(self, tokens: int) -> float:
        """Saved elements that do not grow with the batch: rotary's cos and sin tables, made
        for q and for k (four tables of tokens x head_dim/2). Left out of the per-sample count
        (a few MiB at most); the saved-activations test checks them too."""
        return 2.0 * tokens * self.head_dim if self.rotary else 0.0


# --- input stages ---------------------------------------------------------------------------


def position_params(modality: ModalityInfo, width: int, learned: bool = True) -> int:
    """The learned position table: one row per token of the modality (none with rotary
    positions, which the blocks apply)."""
    return modality.tokens * width if learned else 0


def embedding_stage_params(modality: ModalityInfo, width: int, learned: bool = True) -> int:
    """Token ids: Embedding(vocab, width) plus the position table."""
    assert modality.vocab is not None
    return modality.vocab * width + position_params(modality, width, learned)


def linear_stage_params(
    n_in: int, modality: ModalityInfo, width: int, learned: bool = True, bias: bool = True
) -> int:
    """Feature vectors or flattened pixel patches: Linear(n_in, width) plus the position table."""
    return linear_params(n_in, width, bias) + position_params(modality, width, learned)


def modality_form(modality: ModalityInfo) -> str:
    """'vocab' (token ids), 'features' (float vectors) or 'image' (raw pixels)."""
    if modality.vocab is not None:
        return "vocab"
    if modality.features is not None:
        return "features"
    return "image"


def int_arg(args: Args, name: str) -> int:
    return int(args[name])  # type: ignore[arg-type]


def opt_int_arg(args: Args, name: str) -> int | None:
    value = args.get(name)
    return None if value is None else int(value)  # type: ignore[arg-type]
