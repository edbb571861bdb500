"""``transformer`` and ``vit``: stacks of pre-norm self-attention blocks.

Both kinds run the same block (a norm, multi-head self-attention with a fused q/k/v and an
output projection, a norm, a feed-forward net); they differ in what they read. A transformer
reads token ids (an embedding) or feature vectors (a linear projection) and may be causal with
an LM head; a vit reads raw images as flattened ``3 x patch x patch`` pixel patches.

The block's variants are kind arguments (``common.BlockShape``): ``act = "gelu" | "swiglu"``,
``norm = "layernorm" | "rmsnorm"``, ``kv_heads`` (grouped-query attention), ``bias`` (every
linear layer of the block and of the input projection), ``qkv_bias`` (q/k/v only, Qwen style;
default: ``bias``). A transformer also takes ``pos = "learned" | "rotary"`` (rotary: no
position table, q and k rotated in every block, ``rope_theta`` its base) and
``tie_embeddings`` (the LM head multiplies by the token embedding instead of a matrix of its
own). A vit keeps its learned position table and has no head, so it takes neither. The
defaults are the GPT-2/ViT block.

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


def _heads_default(resolved: dict) -> int:
    return int(resolved["heads"])


def _bias_default(resolved: dict) -> bool:
    return bool(resolved["bias"])


# The block's arguments, in the order their defaults need (kv_heads after heads, qkv_bias after
# bias); the kinds splice them into their schemas.
_BLOCK_HEAD = (
    ArgSpec("layers", int, REQUIRED, doc="identical blocks in the stack"),
    ArgSpec("hidden", int, REQUIRED, doc="model width"),
    ArgSpec("heads", int, REQUIRED, doc="attention heads; must divide hidden"),
    ArgSpec("ffn", int, c.ffn_default, doc="feed-forward width (of each SwiGLU matrix)"),
)
_BLOCK_VARIANTS = (
    ArgSpec("kv_heads", int, _heads_default, doc="K/V heads (grouped-query); must divide heads"),
    ArgSpec("act", str, "gelu", doc="feed-forward activation", choices=c.ACTIVATIONS),
    ArgSpec("norm", str, "layernorm", doc="the block's norms", choices=c.NORMS),
    ArgSpec("bias", bool, True, minimum=None, doc="biases on every linear layer"),
    ArgSpec("qkv_bias", bool, _bias_default, minimum=None, doc="biases on q/k/v (default: bias)"),
)


class _BlockKind(Kind):
    """What transformer and vit share: the block, its costs and the width rules."""

    def check_resolved(self, args: Args) -> list[str]:
        hidden, heads = c.int_arg(args, "hidden"), c.int_arg(args, "heads")
        kv_heads = c.int_arg(args, "kv_heads")
        if hidden % heads:
            return [
                f"{self.name}(): hidden = {hidden} is not divisible by heads = {heads} "
                f"(each head needs hidden / heads channels)"
            ]
        problems = []
        if heads % kv_heads:
            problems.append(
                f"{self.name}(): heads = {heads} is not divisible by kv_heads = {kv_heads} "
                f"(each K/V head serves heads / kv_heads query heads)"
            )
        if self.block(args).rotary and (hidden // heads) % 2:
            problems.append(
                f"{self.name}(): rotary positions need an even head width, but hidden / heads "
                f"= {hidden // heads}"
            )
        return problems

    def block(self, args: Args) -> c.BlockShape:
        """The block these arguments describe."""
        return c.BlockShape(
            hidden=c.int_arg(args, "hidden"),
            heads=c.int_arg(args, "heads"),
            kv_heads=c.int_arg(args, "kv_heads"),
            ffn=c.int_arg(args, "ffn"),
            act=str(args["act"]),
            norm=str(args["norm"]),
            bias=bool(args["bias"]),
            qkv_bias=bool(args["qkv_bias"]),
            rotary=args.get("pos", "learned") == "rotary",
            rope_theta=float(args.get("rope_theta", 10000.0)),
        )

    def learned_positions(self, args: Args) -> bool:
        return args.get("pos", "learned") == "learned"

    def in_width(self, args: Args) -> int:
        return c.int_arg(args, "hidden")

    def out_width(self, args: Args) -> int:
        return c.int_arg(args, "hidden")

    def forward_flops(self, args: Args, in_tokens: int) -> float:
        return self.block(args).flops(in_tokens)

    def layer_params(self, args: Args) -> int:
        return self.block(args).params()

    def activation_elements(self, args: Args, in_tokens: int) -> float:
        return self.block(args).activations(in_tokens)

    def _causal(self, args: Args) -> bool:
        return False

    def build_layer(self, args: Args, *, last: bool = True) -> nn.Module:
        """One block; ``last`` marks the module's final layer, where ``out_tokens`` pools.

        A caller that does not say gets a pooling layer; pooling is idempotent once the tokens
        are down to ``out_tokens``, so a stack built that way still has the right output shape.
        """
        from spindle_dsl.kinds.layers import SelfAttentionBlock

        return SelfAttentionBlock(
            self.block(args),
            causal=self._causal(args),
            out_tokens=c.opt_int_arg(args, "out_tokens") if last else None,
        )


@register_kind
class TransformerKind(_BlockKind):
    """``transformer(layers, hidden, heads, ffn = 4*hidden, causal = false, vocab?, ...)``
    with the block variants and ``pos``, ``rope_theta``, ``tie_embeddings``."""

    name: ClassVar[str] = "transformer"
    schema: ClassVar[tuple[ArgSpec, ...]] = (
        *_BLOCK_HEAD,
        ArgSpec("causal", bool, False, minimum=None, doc="mask attention to earlier tokens"),
        ArgSpec("vocab", int, None, doc="vocabulary size; a causal model gets an LM head"),
        *_BLOCK_VARIANTS,
        ArgSpec("pos", str, "learned", doc="position encoding", choices=c.POSITIONS),
        ArgSpec("rope_theta", float, 10000.0, doc="rotary base (pos = rotary)"),
        ArgSpec(
            "tie_embeddings",
            bool,
            False,
            minimum=None,
            doc="the LM head reuses the token embedding",
        ),
        c.OUT_TOKENS,
    )

    def check_resolved(self, args: Args) -> list[str]:
        problems = super().check_resolved(args)
        if args.get("tie_embeddings") and not self.has_head(args):
            problems.append(
                "transformer(): tie_embeddings ties the LM head to the token embedding, but "
                "only a causal transformer with a vocab has a head; set causal = true and vocab"
            )
        return problems

    def _causal(self, args: Args) -> bool:
        return bool(args.get("causal", False))

    def tied_embeddings(self, args: Args) -> bool:
        """The LM head multiplies by the token embedding of the module's vocab input stage."""
        return bool(args.get("tie_embeddings")) and self.has_head(args)

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
        hidden, learned = c.int_arg(args, "hidden"), self.learned_positions(args)
        if c.modality_form(modality) == "vocab":
            return c.embedding_stage_params(modality, hidden, learned)
        assert modality.features is not None, f"transformer cannot read {modality.name}"
        return c.linear_stage_params(
            modality.features, modality, hidden, learned, bool(args["bias"])
        )

    def has_head(self, args: Args) -> bool:
        """An LM head exists for a causal transformer with a vocabulary."""
        return self._causal(args) and args.get("vocab") is not None

    def head_params(self, args: Args) -> int:
        if not self.has_head(args):
            return 0
        hidden, vocab = c.int_arg(args, "hidden"), c.int_arg(args, "vocab")
        matrix = 0 if self.tied_embeddings(args) else c.linear_params(hidden, vocab, bias=False)
        return c.norm_params(str(args["norm"]), hidden) + matrix

    def build_input_stage(self, args: Args, modality: ModalityInfo) -> nn.Module:
        from spindle_dsl.kinds.layers import EmbeddingStage, LinearStage

        problem = self.reads_modality(args, modality)
        if problem:
            raise TypeError(problem)
        hidden, learned = c.int_arg(args, "hidden"), self.learned_positions(args)
        if c.modality_form(modality) == "vocab":
            assert modality.vocab is not None
            tied = self.tied_embeddings(args)
            return EmbeddingStage(modality.vocab, modality.tokens, hidden, learned, tied)
        assert modality.features is not None
        return LinearStage(modality.features, modality.tokens, hidden, learned, bool(args["bias"]))

    def build_head(self, args: Args) -> nn.Module | None:
        if not self.has_head(args):
            return None
        from spindle_dsl.kinds.layers import LMHead

        return LMHead(
            c.int_arg(args, "hidden"),
            c.int_arg(args, "vocab"),
            norm=str(args["norm"]),
            tied=self.tied_embeddings(args),
        )


@register_kind
class VitKind(_BlockKind):
    """``vit(layers, hidden, heads, ffn = 4*hidden, patch)`` with the block variants: reads
    raw images only."""

    name: ClassVar[str] = "vit"
    schema: ClassVar[tuple[ArgSpec, ...]] = (
        *_BLOCK_HEAD,
        ArgSpec("patch", int, REQUIRED, doc="side of a square pixel patch (one token each)"),
        *_BLOCK_VARIANTS,
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
        return c.linear_stage_params(
            self.patch_features(args), modality, c.int_arg(args, "hidden"), bias=bool(args["bias"])
        )

    def build_input_stage(self, args: Args, modality: ModalityInfo) -> nn.Module:
        from spindle_dsl.kinds.layers import LinearStage

        problem = self.reads_modality(args, modality)
        if problem:
            raise TypeError(problem)
        return LinearStage(
            self.patch_features(args),
            modality.tokens,
            c.int_arg(args, "hidden"),
            bias=bool(args["bias"]),
        )
