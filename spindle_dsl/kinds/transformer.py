"""``transformer`` and ``vit``: stacks of pre-norm self-attention blocks.

Both kinds run the same block (a norm, multi-head self-attention with a fused q/k/v and an
output projection, a norm, a feed-forward net); they differ in what they read. A transformer
reads token ids (an embedding) or feature vectors (a linear projection, or Whisper's
convolution stem) and may be causal with an LM head; a vit reads raw images as flattened
``3 x patch x patch`` pixel patches.

The block's variants are kind arguments (``common.BlockShape``): ``act = "gelu" | "swiglu" |
"quick_gelu" | "gelu_tanh"``, ``norm = "layernorm" | "rmsnorm"`` with ``norm_eps``,
``kv_heads`` (grouped-query attention), ``head_dim`` (channels per head when not hidden /
heads), ``bias`` (every linear layer of the block and of the input projection, unless one of
the next says otherwise), ``qkv_bias`` (q/k/v, Qwen style), ``k_bias`` (k alone, off for
Whisper), ``out_bias`` (the attention's output projection, on with Llama's attention_bias) and
``mlp_bias`` (the feed-forward linears). A transformer also takes ``pos = "learned" | "rotary"
| "sinusoidal"`` (rotary: no position table, q and k rotated in every block, ``rope_theta`` its
base, ``rope_scaling = "llama3"`` with its factors; sinusoidal: a fixed table, for features),
``stem = "linear" | "conv"`` (Whisper's two convolutions for features), ``final_norm`` (a norm
after the last block, for a transformer without an LM head) and ``tie_embeddings`` (the LM
head multiplies by the token embedding instead of a matrix of its own). A vit keeps its
learned position table and has no LM head; it takes ``patch_bias``, ``cls``, ``embed_norm``,
``final_norm``, ``pool`` and ``output`` (``kinds/tower.py``). The defaults are the
GPT-2/ViT block.

``out_tokens`` on either kind keeps every layer at its input length and makes the module's last
layer average-pool the tokens down to ``out_tokens`` (adaptive average pooling along the token
axis: parameter-free, and its few FLOPs are not counted).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from spindle_dsl.kinds import common as c
from spindle_dsl.kinds import tower as tw
from spindle_dsl.kinds.base import REQUIRED, Args, ArgSpec, Kind, register_kind

if TYPE_CHECKING:
    from torch import nn

    from spindle_dsl.metagraph import ModalityInfo


def _heads_default(resolved: dict) -> int:
    return int(resolved["heads"])


def _bias_default(resolved: dict) -> bool:
    return bool(resolved["bias"])


def _qkv_bias_default(resolved: dict) -> bool:
    return bool(resolved["qkv_bias"])


def _eps_default(resolved: dict) -> float:
    return c.default_norm_eps(str(resolved["norm"]))


def _llama3(value: float | int):
    """A rope-scaling argument's default: Llama 3.1's value with ``rope_scaling = "llama3"``,
    else absent."""
    return lambda resolved: value if resolved.get("rope_scaling") == "llama3" else None


def _flag(name: str, default, doc: str) -> ArgSpec:
    return ArgSpec(name, bool, default, minimum=None, doc=doc)


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
    ArgSpec("head_dim", int, None, doc="channels per head (default hidden / heads)"),
    ArgSpec("act", str, "gelu", doc="feed-forward activation", choices=c.ACTIVATIONS),
    ArgSpec("norm", str, "layernorm", doc="the block's norms", choices=c.NORMS),
    ArgSpec("norm_eps", float, _eps_default, minimum=0, doc="the norms' epsilon"),
    _flag("bias", True, "biases on every linear layer"),
    _flag("qkv_bias", _bias_default, "biases on q/k/v (default: bias)"),
    _flag("k_bias", _qkv_bias_default, "a bias on k (default: qkv_bias)"),
    _flag("out_bias", _bias_default, "a bias on the attention output (default: bias)"),
    _flag("mlp_bias", _bias_default, "biases on the feed-forward linears (default: bias)"),
)
_FINAL_NORM = _flag("final_norm", False, "a norm after the last block")


class _BlockKind(Kind):
    """What transformer and vit share: the block, its costs and the width rules."""

    def check_resolved(self, args: Args) -> list[str]:
        hidden, heads = c.int_arg(args, "hidden"), c.int_arg(args, "heads")
        kv_heads = c.int_arg(args, "kv_heads")
        if hidden % heads and args.get("head_dim") is None:
            return [
                f"{self.name}(): hidden = {hidden} is not divisible by heads = {heads} "
                f"(each head needs hidden / heads channels; or give head_dim)"
            ]
        problems = []
        if heads % kv_heads:
            problems.append(
                f"{self.name}(): heads = {heads} is not divisible by kv_heads = {kv_heads} "
                f"(each K/V head serves heads / kv_heads query heads)"
            )
        block = self.block(args)
        if block.rotary and block.head_dim % 2:
            problems.append(
                f"{self.name}(): rotary positions need an even head width, but it is "
                f"{block.head_dim}"
            )
        if args.get("k_bias") and not args.get("qkv_bias"):
            problems.append(f"{self.name}(): k_bias needs qkv_bias (k is one of q/k/v)")
        return problems

    def block(self, args: Args) -> c.BlockShape:
        """The block these arguments describe."""
        scaling = None
        if args.get("rope_scaling", "none") == "llama3":
            scaling = c.RopeScaling(
                float(args["rope_factor"]),
                float(args["rope_low_freq_factor"]),
                float(args["rope_high_freq_factor"]),
                c.int_arg(args, "rope_original_max"),
            )
        return c.BlockShape(
            hidden=c.int_arg(args, "hidden"),
            heads=c.int_arg(args, "heads"),
            kv_heads=c.int_arg(args, "kv_heads"),
            ffn=c.int_arg(args, "ffn"),
            act=str(args["act"]),
            norm=str(args["norm"]),
            bias=bool(args.get("mlp_bias", args["bias"])),
            qkv_bias=bool(args["qkv_bias"]),
            rotary=args.get("pos", "learned") == "rotary",
            rope_theta=float(args.get("rope_theta", 10000.0)),
            norm_eps=float(args["norm_eps"]) if "norm_eps" in args else None,
            head_width=c.opt_int_arg(args, "head_dim"),
            k_bias=bool(args.get("k_bias", args["qkv_bias"])),
            out_bias=bool(args.get("out_bias", args["bias"])),
            rope_scaling=scaling,
        )

    def tail(self, args: Args) -> tw.Tail:
        """What the last layer runs after its block (``kinds/tower.py``)."""
        return tw.Tail(
            hidden=c.int_arg(args, "hidden"),
            norm=str(args["norm"]),
            final_norm=bool(args.get("final_norm", False)),
            pool=str(args.get("pool", "none")),
            output=str(args.get("output", "tokens")),
            cls=bool(args.get("cls", False)),
            heads=c.int_arg(args, "heads"),
            ffn=c.int_arg(args, "ffn"),
        )

    def learned_positions(self, args: Args) -> bool:
        return args.get("pos", "learned") == "learned"

    def in_width(self, args: Args) -> int:
        return c.int_arg(args, "hidden")

    def out_width(self, args: Args) -> int:
        return c.int_arg(args, "hidden")

    def out_tokens(self, args: Args, in_tokens: int) -> int:
        tokens = self.tail(args).out_tokens(self.layer_tokens(args, in_tokens))
        return int(args.get("out_tokens") or tokens)

    def forward_flops(self, args: Args, in_tokens: int) -> float:
        return self.block(args).flops(self.layer_tokens(args, in_tokens))

    def layer_params(self, args: Args) -> int:
        return self.block(args).params()

    def activation_elements(self, args: Args, in_tokens: int) -> float:
        return self.block(args).activations(self.layer_tokens(args, in_tokens))

    def tail_params(self, args: Args) -> int:
        return self.tail(args).params()

    def tail_flops(self, args: Args, in_tokens: int) -> float:
        return self.tail(args).flops(self.layer_tokens(args, in_tokens))

    def tail_activations(self, args: Args, in_tokens: int) -> float:
        return self.tail(args).activations(self.layer_tokens(args, in_tokens))

    def _causal(self, args: Args) -> bool:
        return False

    def build_layer(self, args: Args, *, last: bool = True) -> nn.Module:
        """One block; ``last`` marks the module's final layer, where the tail runs and
        ``out_tokens`` pools.

        A caller that does not say gets the last layer; pooling is idempotent once the tokens
        are down to ``out_tokens``, so a stack built that way still has the right output shape.
        """
        from spindle_dsl.kinds.layers import SelfAttentionBlock

        out_tokens = c.opt_int_arg(args, "out_tokens") if last else None
        tail = self.tail(args)
        if last and tail.exists:
            from spindle_dsl.kinds.tower_layers import TailedBlock

            return TailedBlock(self.block(args), self._causal(args), out_tokens, tail)
        block = self.block(args)
        return SelfAttentionBlock(block, causal=self._causal(args), out_tokens=out_tokens)


@register_kind
class TransformerKind(_BlockKind):
    """``transformer(layers, hidden, heads, ffn = 4*hidden, causal = false, vocab?, ...)``
    with the block variants and ``pos``, ``rope_theta``, ``rope_scaling``, ``stem``,
    ``final_norm``, ``tie_embeddings``."""

    name: ClassVar[str] = "transformer"
    schema: ClassVar[tuple[ArgSpec, ...]] = (
        *_BLOCK_HEAD,
        ArgSpec("causal", bool, False, minimum=None, doc="mask attention to earlier tokens"),
        ArgSpec("vocab", int, None, doc="vocabulary size; a causal model gets an LM head"),
        *_BLOCK_VARIANTS,
        ArgSpec("pos", str, "learned", doc="position encoding", choices=c.POSITIONS),
        ArgSpec("rope_theta", float, 10000.0, doc="rotary base (pos = rotary)"),
        ArgSpec("rope_scaling", str, "none", doc="rotary scaling", choices=c.ROPE_SCALINGS),
        ArgSpec("rope_factor", float, _llama3(8.0), doc="llama3 scaling: the factor"),
        ArgSpec("rope_low_freq_factor", float, _llama3(1.0), doc="llama3 scaling"),
        ArgSpec("rope_high_freq_factor", float, _llama3(4.0), doc="llama3 scaling"),
        ArgSpec("rope_original_max", int, _llama3(8192), doc="llama3 scaling: trained length"),
        ArgSpec("stem", str, "linear", doc="the features input stage", choices=tw.STEMS),
        ArgSpec("positions", int, None, doc="rows of the position table (default: the input)"),
        _FINAL_NORM,
        _flag("tie_embeddings", False, "the LM head reuses the token embedding"),
        c.OUT_TOKENS,
    )

    def check_resolved(self, args: Args) -> list[str]:
        problems = super().check_resolved(args)
        if args.get("tie_embeddings") and not self.has_head(args):
            problems.append(
                "transformer(): tie_embeddings ties the LM head to the token embedding, but "
                "only a causal transformer with a vocab has a head; set causal = true and vocab"
            )
        if args.get("final_norm") and self.has_head(args):
            problems.append(
                "transformer(): final_norm is for a transformer without an LM head; the head "
                "of a causal transformer with a vocab has its own norm"
            )
        if args.get("rope_scaling") != "none" and args.get("pos") != "rotary":
            problems.append('transformer(): rope_scaling needs pos = "rotary"')
        return problems

    def _causal(self, args: Args) -> bool:
        return bool(args.get("causal", False))

    def layer_tokens(self, args: Args, in_tokens: int) -> int:
        return tw.stem_tokens(in_tokens, str(args.get("stem", "linear")))

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
        if form == "vocab" and (args.get("stem") == "conv" or args.get("pos") == "sinusoidal"):
            return (
                f"transformer reads token ids from '{modality.name}', but stem = \"conv\" and "
                f'pos = "sinusoidal" are for features (Whisper\'s encoder)'
            )
        rows, fed = args.get("positions"), self._rows(args, modality.tokens, None)
        if rows is not None and fed > int(rows):
            return (
                f"modality '{modality.name}' brings {fed} positions but transformer has "
                f"positions = {rows}"
            )
        return None

    def _rows(self, args: Args, tokens: int, rows: object) -> int:
        """Rows of the position table: ``positions``, else the tokens after the stem."""
        if rows is not None:
            return int(rows)  # type: ignore[call-overload]
        return tw.stem_tokens(tokens, str(args.get("stem", "linear")))

    def input_stage_params(self, args: Args, modality: ModalityInfo) -> int:
        hidden, learned = c.int_arg(args, "hidden"), self.learned_positions(args)
        rows = self._rows(args, modality.tokens, args.get("positions"))
        if c.modality_form(modality) == "vocab":
            return c.embedding_stage_params(replace(modality, tokens=rows), hidden, learned)
        assert modality.features is not None, f"transformer cannot read {modality.name}"
        stem, bias = str(args.get("stem", "linear")), bool(args["bias"])
        f = modality.features
        if stem == "conv":
            stage = c.linear_params(3 * f, hidden, bias) + c.linear_params(3 * hidden, hidden, bias)
        else:
            stage = c.linear_params(f, hidden, bias)
        return stage + (rows * hidden if args.get("pos") in ("learned", "sinusoidal") else 0)

    def input_stage_flops(self, args: Args, modality: ModalityInfo) -> float | None:
        if c.modality_form(modality) == "vocab" or modality.features is None:
            return None
        hidden, t, f = c.int_arg(args, "hidden"), modality.tokens, modality.features
        if args.get("stem") == "conv":
            half = tw.stem_tokens(t, "conv")
            return c.matmul_flops(t, 3 * f, hidden) + c.matmul_flops(half, 3 * hidden, hidden)
        return c.matmul_flops(t, f, hidden)

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
        rows = self._rows(args, modality.tokens, args.get("positions"))
        if c.modality_form(modality) == "vocab":
            assert modality.vocab is not None
            tied = self.tied_embeddings(args)
            return EmbeddingStage(modality.vocab, rows, hidden, learned, tied)
        assert modality.features is not None
        stem, pos, bias = str(args.get("stem", "linear")), str(args["pos"]), bool(args["bias"])
        if stem == "conv" or pos == "sinusoidal":
            from spindle_dsl.kinds.tower_layers import FeatureStage

            return FeatureStage(modality.features, rows, hidden, bias, stem, pos)
        return LinearStage(modality.features, rows, hidden, learned, bias)

    def build_head(self, args: Args) -> nn.Module | None:
        if not self.has_head(args):
            return None
        from spindle_dsl.kinds.layers import LMHead

        return LMHead(
            c.int_arg(args, "hidden"),
            c.int_arg(args, "vocab"),
            norm=str(args["norm"]),
            tied=self.tied_embeddings(args),
            eps=float(args["norm_eps"]),
        )


@register_kind
class VitKind(_BlockKind):
    """``vit(layers, hidden, heads, ffn = 4*hidden, patch)`` with the block variants and the
    tower's pieces (``patch_bias``, ``cls``, ``embed_norm``, ``final_norm``, ``pool``,
    ``output``): reads raw images only."""

    name: ClassVar[str] = "vit"
    schema: ClassVar[tuple[ArgSpec, ...]] = (
        *_BLOCK_HEAD,
        ArgSpec("patch", int, REQUIRED, doc="side of a square pixel patch (one token each)"),
        *_BLOCK_VARIANTS,
        _flag("patch_bias", _bias_default, "a bias on the patch projection (default: bias)"),
        _flag("cls", False, "a learned CLS token before the patches"),
        _flag("embed_norm", False, "a norm of the embedded tokens (CLIP's pre-norm)"),
        _FINAL_NORM,
        ArgSpec("pool", str, "none", doc="the pooling head", choices=tw.POOLS),
        ArgSpec("output", str, "tokens", doc="what the module hands on", choices=tw.OUTPUTS),
        c.OUT_TOKENS,
    )

    def check_resolved(self, args: Args) -> list[str]:
        problems = super().check_resolved(args)
        pool, output = args.get("pool"), args.get("output")
        if output == "cls" and not args.get("cls"):
            problems.append('vit(): output = "cls" needs cls = true')
        if output == "pooled" and pool == "none":
            problems.append('vit(): output = "pooled" needs a pool ("norm", "dense" or "map")')
        if pool in ("norm", "dense") and not args.get("cls"):
            problems.append(f'vit(): pool = "{pool}" reads the CLS token; set cls = true')
        if pool == "map" and args.get("act") == "swiglu":
            problems.append('vit(): pool = "map" has a plain feed-forward; act cannot be swiglu')
        return problems

    def layer_tokens(self, args: Args, in_tokens: int) -> int:
        return in_tokens + int(bool(args.get("cls", False)))

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

    def _plain_stage(self, args: Args) -> bool:
        """The stage is a linear layer and a position table (none of the tower's pieces)."""
        return not (args.get("cls") or args.get("embed_norm")) and args.get(
            "patch_bias", args["bias"]
        ) == bool(args["bias"])

    def input_stage_params(self, args: Args, modality: ModalityInfo) -> int:
        hidden, cls = c.int_arg(args, "hidden"), bool(args.get("cls", False))
        bias = bool(args.get("patch_bias", args["bias"]))
        stage = c.linear_stage_params(self.patch_features(args), modality, hidden, bias=bias)
        norm = c.norm_params(str(args["norm"]), hidden) if args.get("embed_norm") else 0
        return stage + (2 * hidden if cls else 0) + norm

    def input_stage_flops(self, args: Args, modality: ModalityInfo) -> float | None:
        hidden = c.int_arg(args, "hidden")
        return c.matmul_flops(modality.tokens, self.patch_features(args), hidden)

    def build_input_stage(self, args: Args, modality: ModalityInfo) -> nn.Module:
        from spindle_dsl.kinds.layers import LinearStage

        problem = self.reads_modality(args, modality)
        if problem:
            raise TypeError(problem)
        hidden = c.int_arg(args, "hidden")
        if self._plain_stage(args):
            return LinearStage(
                self.patch_features(args), modality.tokens, hidden, bias=bool(args["bias"])
            )
        from spindle_dsl.kinds.tower_layers import PatchStage

        return PatchStage(
            self.patch_features(args),
            modality.tokens,
            hidden,
            bias=bool(args.get("patch_bias", args["bias"])),
            cls=bool(args.get("cls", False)),
            norm=str(args["norm"]) if args.get("embed_norm") else None,
            eps=float(args["norm_eps"]),
        )
