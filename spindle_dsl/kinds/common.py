"""Pieces the built-in kinds share: argument specs, the input-stage rules and cost formulas.

The built-in kinds are all made of the same few parts (pre-LN attention blocks, two-layer GELU
feed-forward nets, linear or embedding input stages with a learned position table). Writing
each part's parameter and FLOP formula once here keeps the four kinds consistent with each
other and with the PyTorch layers in ``layers.py``, which the tests count against these.

Conventions (every count is per sample and per layer):
- FLOPs are 2 per multiply-accumulate of the matmuls, including attention scores (QK^T) and
  attention-weighted values (AV). Attention is counted over the full sequence even when causal
  (a dense kernel computes it all). Norms, softmax, GELU, biases and residual adds are left out:
  they are O(tokens x width), below 1% of the matmuls at any realistic width.
- Activation elements are the tensors one layer keeps for its backward pass on the plain
  (non-fused) attention path, which stores the softmax probabilities (heads x q x k); fused
  kernels store less, so this is a safe upper bound for memory planning.
"""

from __future__ import annotations

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


def linear_params(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def ffn_params(hidden: int, ffn: int) -> int:
    """Linear(hidden, ffn) - GELU - Linear(ffn, hidden), both with bias."""
    return linear_params(hidden, ffn) + linear_params(ffn, hidden)


def self_attention_block_params(hidden: int, ffn: int) -> int:
    """Pre-LN block: LN, fused qkv (3h x h, bias), out proj (h x h, bias), LN, FFN."""
    return (
        layernorm_params(hidden)
        + linear_params(hidden, 3 * hidden)
        + linear_params(hidden, hidden)
        + layernorm_params(hidden)
        + ffn_params(hidden, ffn)
    )


# --- FLOPs ----------------------------------------------------------------------------------


def matmul_flops(rows: int, n_in: int, n_out: int) -> float:
    """A (rows x n_in) @ (n_in x n_out) product: 2 FLOPs per multiply-accumulate."""
    return 2.0 * rows * n_in * n_out


def self_attention_block_flops(tokens: int, hidden: int, ffn: int) -> float:
    t, h = tokens, hidden
    return (
        matmul_flops(t, h, 3 * h)  # qkv projection
        + matmul_flops(t, h, t)  # scores QK^T, all heads together
        + matmul_flops(t, t, h)  # probabilities x V
        + matmul_flops(t, h, h)  # output projection
        + matmul_flops(t, h, ffn)
        + matmul_flops(t, ffn, h)
    )


def self_attention_block_activations(tokens: int, hidden: int, ffn: int, heads: int) -> float:
    """What torch saves for backward in one ``SelfAttentionBlock``, per sample (measured with
    ``saved_tensors_hooks`` in ``tests/kinds/test_saved_activations.py``)."""
    t, h = tokens, hidden
    # LN1 in, qkv in, q/k/v, attention out (= proj in, a view), LN2 in, fc1 in: 8th; the GELU's
    # input and output (fc2 in): 2tf; the fused attention kernel keeps its log-sum-exp (heads x
    # t), not the t x t probabilities; each LayerNorm its mean and 1/std (2t twice).
    return 8.0 * t * h + 2.0 * t * ffn + float(heads) * t + 4.0 * t


# --- input stages ---------------------------------------------------------------------------


def position_params(modality: ModalityInfo, width: int) -> int:
    """The learned position table: one row per token of the modality."""
    return modality.tokens * width


def embedding_stage_params(modality: ModalityInfo, width: int) -> int:
    """Token ids: Embedding(vocab, width) plus the position table."""
    assert modality.vocab is not None
    return modality.vocab * width + position_params(modality, width)


def linear_stage_params(n_in: int, modality: ModalityInfo, width: int) -> int:
    """Feature vectors or flattened pixel patches: Linear(n_in, width) plus the position table."""
    return linear_params(n_in, width) + position_params(modality, width)


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
