"""What a stack of blocks carries around its layers: the pieces pretrained towers and encoders
have beyond the block (costs only; the PyTorch modules are in ``tower_layers.py``).

Before the first block, in the input stage:
- a CLS token (``cls``): one learned vector put in front of the patch tokens, with its own
  row of the position table (ViT, CLIP);
- a norm of the embedded tokens (``embed_norm``: CLIP's ``pre_layrnorm``);
- for feature inputs, Whisper's convolution stem (``stem = "conv"``: a kernel-3 convolution,
  GELU, a kernel-3 stride-2 convolution, GELU; the layers see half the frames) and fixed
  sine/cosine positions (``pos = "sinusoidal"``, a table that does not train).

After the last block, in the module's last layer (the *tail*), which is where the runtime
already changes a module's token count:
- a final norm over every token (``final_norm``: ViT's ``layernorm``, SigLIP's
  ``post_layernorm``, Whisper's ``layer_norm``, CLIP text's ``final_layer_norm``);
- a pooling head (``pool``): ``"norm"``, a norm of the CLS token (CLIP's ``post_layernorm``);
  ``"dense"``, tanh of a linear layer of the CLS token (ViT's pooler); ``"map"``, attention
  pooling by one learned query followed by a norm and a feed-forward net (SigLIP's head);
- what the module hands on (``output``): ``"tokens"`` (every token, the CLS token first),
  ``"patches"`` (every token but the CLS token), ``"cls"`` (the CLS token) or ``"pooled"``
  (the pooling head's output), after the final norm.

The tail's parameters belong to the last layer (``tail_params``); its FLOPs and saved
activations are counted apart from the layers' (``tail_flops``, ``tail_activations``) and the
lowering spreads them over the module's layers, so a module's totals are exact. Counting
conventions are ``common``'s: 2 FLOPs per multiply-accumulate of the matmuls and attention,
norms and activations left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spindle_dsl.kinds.common import linear_params, matmul_flops, norm_params

OUTPUTS = ("tokens", "patches", "cls", "pooled")
POOLS = ("none", "norm", "dense", "map")
STEMS = ("linear", "conv")


def stem_tokens(tokens: int, stem: str) -> int:
    """Tokens the layers see after the input stem: half the frames, rounded up, after the
    conv stem's stride-2 convolution (kernel 3, padding 1); all of them after a linear one."""
    return math.ceil(tokens / 2) if stem == "conv" else tokens


@dataclass(frozen=True)
class Tail:
    """The pieces after the last block (see the module docstring), for one sample."""

    hidden: int
    norm: str  # the kind of norm (the block's)
    final_norm: bool = False
    pool: str = "none"
    output: str = "tokens"
    cls: bool = False
    heads: int = 1  # the attention pool's heads (the block's)
    ffn: int = 0  # the attention pool's feed-forward width (the block's)

    @property
    def exists(self) -> bool:
        """Whether the last layer carries anything beyond its block."""
        selects = self.output in ("cls", "pooled") or (self.output == "patches" and self.cls)
        return self.final_norm or self.pool != "none" or selects

    def out_tokens(self, tokens: int) -> int:
        """Tokens handed on, given the tokens the blocks work at."""
        if self.output in ("cls", "pooled"):
            return 1
        return tokens - 1 if self.output == "patches" and self.cls else tokens

    def params(self) -> int:
        h = self.hidden
        out = norm_params(self.norm, h) if self.final_norm else 0
        if self.pool == "norm":
            out += norm_params(self.norm, h)
        elif self.pool == "dense":
            out += linear_params(h, h)
        elif self.pool == "map":
            out += (
                h  # the learned query
                + linear_params(h, 3 * h)  # the fused q/k/v projection
                + linear_params(h, h)  # the output projection
                + norm_params(self.norm, h)
                + linear_params(h, self.ffn)
                + linear_params(self.ffn, h)
            )
        return out

    def flops(self, tokens: int) -> float:
        """Forward FLOPs of the pooling head, which runs only when the output is pooled."""
        if self.output != "pooled":
            return 0.0
        h, t = self.hidden, tokens
        if self.pool == "dense":
            return matmul_flops(1, h, h)
        if self.pool != "map":
            return 0.0
        return (
            matmul_flops(1, h, h)  # the query's projection
            + matmul_flops(t, h, 2 * h)  # k and v of every token
            + matmul_flops(1, h, t)  # scores of the one query
            + matmul_flops(1, t, h)  # probabilities x V
            + matmul_flops(1, h, h)  # output projection
            + matmul_flops(1, h, self.ffn)
            + matmul_flops(1, self.ffn, h)
        )

    def activations(self, tokens: int) -> float:
        """Elements the tail saves for backward per sample, beyond the block's (what
        autograd keeps, pinned by ``tests/kinds/test_tower_options.py``)."""
        t, h, f = tokens, self.hidden, self.ffn
        kept = 0.0
        if self.final_norm:  # its input (the block's output) and its statistics
            kept += t * h + (2.0 * t if self.norm == "layernorm" else t * h + t)
        if self.output != "pooled" or self.pool == "none":
            return kept
        # the pool's input: the CLS token (a view) or every token, of the block's output or
        # of the final norm's, kept whole
        kept += t * h
        if self.pool == "norm":
            kept += 2.0 if self.norm == "layernorm" else h + 1.0
        elif self.pool == "dense":
            kept += h  # tanh's output
        else:
            # k and v (one fused output), the query, the attention output and its
            # log-sum-exp, the merged heads, the residual's norm input, its statistics and
            # output, the feed-forward's hidden layer in and out
            kept += 2.0 * t * h + 4.0 * h + self.heads + 2.0 + 2.0 * f
        return kept
