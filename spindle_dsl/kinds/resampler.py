"""``resampler(in, hidden, heads, out_tokens, layers = 1)``: a Perceiver/Q-Former-style pooler.

Each layer owns ``out_tokens`` learned queries of width ``hidden``. The queries (pre-LN)
cross-attend to the layer's inputs (pre-LN, keys and values projected from ``in``), then pass a
pre-LN Linear-GELU-Linear feed-forward, both with residuals. So any number of input tokens
becomes exactly ``out_tokens`` tokens of width ``hidden``. A stacked layer reads the previous
layer's output as its keys and values, hence ``layers > 1`` needs ``in == hidden``; every layer
is costed at the module's input tokens (an upper bound for the layers after the first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from spindle_dsl.kinds import common as c
from spindle_dsl.kinds.base import REQUIRED, Args, ArgSpec, Kind, register_kind

if TYPE_CHECKING:
    from torch import nn

    from spindle_dsl.metagraph import ModalityInfo


@register_kind
class ResamplerKind(Kind):
    """Learned queries cross-attending to a variable number of tokens."""

    name: ClassVar[str] = "resampler"
    schema: ClassVar[tuple[ArgSpec, ...]] = (
        ArgSpec("in", int, REQUIRED, doc="width of each input token"),
        ArgSpec("hidden", int, REQUIRED, doc="width of the queries and of each output token"),
        ArgSpec("heads", int, REQUIRED, doc="attention heads; must divide hidden"),
        ArgSpec("out_tokens", int, REQUIRED, doc="learned queries = tokens per sample out"),
        ArgSpec("layers", int, 1, doc="stacked layers; more than one needs in == hidden"),
        ArgSpec("ffn", int, c.ffn_default, doc="feed-forward width"),
    )

    def check_resolved(self, args: Args) -> list[str]:
        problems = []
        hidden, heads = c.int_arg(args, "hidden"), c.int_arg(args, "heads")
        if hidden % heads:
            problems.append(
                f"resampler(): hidden = {hidden} is not divisible by heads = {heads} "
                f"(each head needs hidden / heads channels)"
            )
        layers, n_in = c.int_arg(args, "layers"), c.int_arg(args, "in")
        if layers > 1 and n_in != hidden:
            problems.append(
                f"resampler(): layers = {layers} feeds each layer's output into the next, so "
                f"in ({n_in}) must equal hidden ({hidden})"
            )
        return problems

    def in_width(self, args: Args) -> int:
        return c.int_arg(args, "in")

    def out_width(self, args: Args) -> int:
        return c.int_arg(args, "hidden")

    def out_tokens(self, args: Args, in_tokens: int) -> int:
        return c.int_arg(args, "out_tokens")

    def _dims(self, args: Args) -> tuple[int, int, int, int, int]:
        return tuple(c.int_arg(args, k) for k in ("in", "hidden", "ffn", "out_tokens", "heads"))  # type: ignore[return-value]

    def forward_flops(self, args: Args, in_tokens: int) -> float:
        n_in, h, ffn, q, _ = self._dims(args)
        t = in_tokens
        return (
            c.matmul_flops(q, h, h)  # query projection
            + 2 * c.matmul_flops(t, n_in, h)  # key and value projections
            + c.matmul_flops(q, h, t)  # scores
            + c.matmul_flops(q, t, h)  # probabilities x V
            + c.matmul_flops(q, h, h)  # output projection
            + c.matmul_flops(q, h, ffn)
            + c.matmul_flops(q, ffn, h)
        )

    def layer_params(self, args: Args) -> int:
        n_in, h, ffn, q, _ = self._dims(args)
        return (
            q * h  # learned queries
            + c.layernorm_params(h)  # query norm
            + c.layernorm_params(n_in)  # input norm
            + c.linear_params(h, h)  # q
            + 2 * c.linear_params(n_in, h)  # k, v
            + c.linear_params(h, h)  # out
            + c.layernorm_params(h)
            + c.ffn_params(h, ffn)
        )

    def activation_elements(self, args: Args, in_tokens: int) -> float:
        n_in, h, ffn, q, heads = self._dims(args)
        t = in_tokens
        # What torch saves (measured, tests/kinds/test_saved_activations.py): the inputs and
        # their norm (2 t in), k and v (2 t h), the query norm's output, q, the attention
        # output, the FFN norm's input and output (5 q h; the learned queries themselves are a
        # parameter), GELU in/out (2 q ffn), the fused attention's log-sum-exp (heads q) and
        # the three LayerNorms' mean and 1/std (2 t + 4 q).
        return (
            2.0 * t * n_in
            + 2.0 * t * h
            + 5.0 * q * h
            + 2.0 * q * ffn
            + float(heads) * q
            + 2.0 * t
            + 4.0 * q
        )

    def reads_modality(self, args: Args, modality: ModalityInfo) -> str | None:
        if c.modality_form(modality) != "features":
            return (
                f"resampler reads feature modalities only, but '{modality.name}' has no "
                f"`features`; encode it first (a transformer for token ids, a vit for images)"
            )
        return None

    def input_stage_params(self, args: Args, modality: ModalityInfo) -> int:
        assert modality.features is not None, f"resampler cannot read {modality.name}"
        return c.linear_stage_params(modality.features, modality, c.int_arg(args, "in"))

    def build_layer(self, args: Args, *, last: bool = True) -> nn.Module:
        """One layer (``last`` is accepted for a uniform call; every layer emits out_tokens)."""
        from spindle_dsl.kinds.layers import ResamplerLayer

        n_in, h, ffn, q, heads = self._dims(args)
        return ResamplerLayer(n_in, h, heads, q, ffn)

    def build_input_stage(self, args: Args, modality: ModalityInfo) -> nn.Module:
        from spindle_dsl.kinds.layers import LinearStage

        problem = self.reads_modality(args, modality)
        if problem:
            raise TypeError(problem)
        assert modality.features is not None
        return LinearStage(modality.features, modality.tokens, c.int_arg(args, "in"))
