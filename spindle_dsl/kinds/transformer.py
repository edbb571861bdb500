"""``transformer`` and ``vit``: stacks of pre-LN self-attention blocks.

Both kinds run the same block (LayerNorm, multi-head self-attention with a fused qkv and an
output projection, LayerNorm, Linear-GELU-Linear); they differ in what they read. A transformer
reads token ids (an embedding) or feature vectors (a linear projection) and may be causal with
an LM head; a vit reads raw images as flattened ``3 x patch x patch`` pixel patches.

``out_tokens`` on either kind keeps every layer at its input length and makes the module's last
layer average-pool the tokens down to ``out_tokens`` (adaptive average pooling along the token
axis: parameter-free, and its few FLOPs are not counted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from spindle_dsl.kinds import common as c
from spindle_dsl.kinds.base import REQUIRED, Args, ArgSpec, Kind, register_kind

if TYPE_CHECKING:
    from torch import nn

    from spindle_dsl.metagraph import ModalityInfo


class _BlockKind(Kind):
    """What transformer and vit share: the block, its costs and the width rules."""

    def check_resolved(self, args: Args) -> list[str]:
        hidden, heads = c.int_arg(args, "hidden"), c.int_arg(args, "heads")
        if hidden % heads:
            return [
                f"{self.name}(): hidden = {hidden} is not divisible by heads = {heads} "
                f"(each head needs hidden / heads channels)"
            ]
        return []

    def in_width(self, args: Args) -> int:
        return c.int_arg(args, "hidden")

    def out_width(self, args: Args) -> int:
        return c.int_arg(args, "hidden")

    def forward_flops(self, args: Args, in_tokens: int) -> float:
        return c.self_attention_block_flops(
            in_tokens, c.int_arg(args, "hidden"), c.int_arg(args, "ffn")
        )

    def layer_params(self, args: Args) -> int:
        return c.self_attention_block_params(c.int_arg(args, "hidden"), c.int_arg(args, "ffn"))

    def activation_elements(self, args: Args, in_tokens: int) -> float:
        return c.self_attention_block_activations(
            in_tokens, c.int_arg(args, "hidden"), c.int_arg(args, "ffn"), c.int_arg(args, "heads")
        )

    def _causal(self, args: Args) -> bool:
        return False

    def build_layer(self, args: Args, *, last: bool = True) -> nn.Module:
        """One block; ``last`` marks the module's final layer, where ``out_tokens`` pools.

        A caller that does not say gets a pooling layer; pooling is idempotent once the tokens
        are down to ``out_tokens``, so a stack built that way still has the right output shape.
        """
        from spindle_dsl.kinds.layers import SelfAttentionBlock

        return SelfAttentionBlock(
            hidden=c.int_arg(args, "hidden"),
            heads=c.int_arg(args, "heads"),
            ffn=c.int_arg(args, "ffn"),
            causal=self._causal(args),
            out_tokens=c.opt_int_arg(args, "out_tokens") if last else None,
        )


@register_kind
class TransformerKind(_BlockKind):
    """``transformer(layers, hidden, heads, ffn = 4*hidden, causal = false, vocab?)``."""

    name: ClassVar[str] = "transformer"
    schema: ClassVar[tuple[ArgSpec, ...]] = (
        ArgSpec("layers", int, REQUIRED, doc="identical blocks in the stack"),
        ArgSpec("hidden", int, REQUIRED, doc="model width"),
        ArgSpec("heads", int, REQUIRED, doc="attention heads; must divide hidden"),
        ArgSpec("ffn", int, c.ffn_default, doc="feed-forward width"),
        ArgSpec("causal", bool, False, minimum=None, doc="mask attention to earlier tokens"),
        ArgSpec("vocab", int, None, doc="vocabulary size; a causal model gets an LM head"),
        c.OUT_TOKENS,
    )

    def _causal(self, args: Args) -> bool:
        return bool(args.get("causal", False))

    def reads_modality(self, args: Args, modality: ModalityInfo) -> str | None:
        form = c.modality_form(modality)
        if form == "image":
            return (
                f"transformer cannot read raw images from '{modality.name}' (give the modality "
                f"`features` or `vocab`, or encode it with a vit)"
            )
        vocab = c.opt_int_arg(args, "vocab")
        if form == "vocab" and vocab is not None and vocab != modality.vocab:
            return (
                f"transformer has vocab = {vocab} but modality '{modality.name}' has "
                f"vocab = {modality.vocab}; they must agree"
            )
        return None

    def input_stage_params(self, args: Args, modality: ModalityInfo) -> int:
        hidden = c.int_arg(args, "hidden")
        if c.modality_form(modality) == "vocab":
            return c.embedding_stage_params(modality, hidden)
        assert modality.features is not None, f"transformer cannot read {modality.name}"
        return c.linear_stage_params(modality.features, modality, hidden)

    def has_head(self, args: Args) -> bool:
        """An LM head exists for a causal transformer with a vocabulary."""
        return self._causal(args) and args.get("vocab") is not None

    def head_params(self, args: Args) -> int:
        if not self.has_head(args):
            return 0
        hidden, vocab = c.int_arg(args, "hidden"), c.int_arg(args, "vocab")
        return c.layernorm_params(hidden) + c.linear_params(hidden, vocab, bias=False)

    def build_input_stage(self, args: Args, modality: ModalityInfo) -> nn.Module:
        from spindle_dsl.kinds.layers import EmbeddingStage, LinearStage

        problem = self.reads_modality(args, modality)
        if problem:
            raise TypeError(problem)
        hidden = c.int_arg(args, "hidden")
        if c.modality_form(modality) == "vocab":
            assert modality.vocab is not None
            return EmbeddingStage(modality.vocab, modality.tokens, hidden)
        assert modality.features is not None
        return LinearStage(modality.features, modality.tokens, hidden)

    def build_head(self, args: Args) -> nn.Module | None:
        if not self.has_head(args):
            return None
        from spindle_dsl.kinds.layers import LMHead

        return LMHead(c.int_arg(args, "hidden"), c.int_arg(args, "vocab"))


@register_kind
class VitKind(_BlockKind):
    """``vit(layers, hidden, heads, ffn = 4*hidden, patch)``: reads raw images only."""

    name: ClassVar[str] = "vit"
    schema: ClassVar[tuple[ArgSpec, ...]] = (
        ArgSpec("layers", int, REQUIRED, doc="identical blocks in the stack"),
        ArgSpec("hidden", int, REQUIRED, doc="model width"),
        ArgSpec("heads", int, REQUIRED, doc="attention heads; must divide hidden"),
        ArgSpec("ffn", int, c.ffn_default, doc="feed-forward width"),
        ArgSpec("patch", int, REQUIRED, doc="side of a square pixel patch (one token each)"),
        c.OUT_TOKENS,
    )

    def reads_modality(self, args: Args, modality: ModalityInfo) -> str | None:
        form = c.modality_form(modality)
        if form != "image":
            return (
                f"vit reads raw images only, but modality '{modality.name}' has {form}; "
                f"use a transformer for it"
            )
        return None

    def patch_features(self, args: Args) -> int:
        """Values in one flattened RGB patch: the width of the raw data per token."""
        patch = c.int_arg(args, "patch")
        return 3 * patch * patch

    def input_stage_params(self, args: Args, modality: ModalityInfo) -> int:
        return c.linear_stage_params(self.patch_features(args), modality, c.int_arg(args, "hidden"))

    def build_input_stage(self, args: Args, modality: ModalityInfo) -> nn.Module:
        from spindle_dsl.kinds.layers import LinearStage

        problem = self.reads_modality(args, modality)
        if problem:
            raise TypeError(problem)
        return LinearStage(self.patch_features(args), modality.tokens, c.int_arg(args, "hidden"))
