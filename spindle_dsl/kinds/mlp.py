"""``mlp(in, out, hidden?, layers = 1)``: a per-token feed-forward adapter.

One layer is ``Linear(in, hidden) - GELU - Linear(hidden, out)`` when ``hidden`` is given, else a
single ``Linear(in, out)``. Stacking layers feeds each layer's output into the next, so
``layers > 1`` needs ``in == out``. It reads feature modalities (a linear input stage) and the
outputs of other modules; ``out_tokens`` makes the last layer average-pool along tokens.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, ClassVar

from spindle_dsl.kinds import common as c
from spindle_dsl.kinds.base import REQUIRED, Args, ArgSpec, Kind, register_kind

if TYPE_CHECKING:
    from torch import nn

    from spindle_dsl.metagraph import ModalityInfo


@register_kind
class MlpKind(Kind):
    """Per-token projection between widths (encoder heads, modality adapters)."""

    name: ClassVar[str] = "mlp"
    schema: ClassVar[tuple[ArgSpec, ...]] = (
        ArgSpec("in", int, REQUIRED, doc="width of each input token"),
        ArgSpec("out", int, REQUIRED, doc="width of each output token"),
        ArgSpec("hidden", int, None, doc="inner width; absent means one Linear(in, out)"),
        ArgSpec("layers", int, 1, doc="stacked layers; more than one needs in == out"),
        c.OUT_TOKENS,
    )

    def check_resolved(self, args: Args) -> list[str]:
        layers, n_in, n_out = (c.int_arg(args, k) for k in ("layers", "in", "out"))
        if layers > 1 and n_in != n_out:
            return [
                f"mlp(): layers = {layers} stacks each layer's output into the next, so in "
                f"({n_in}) must equal out ({n_out}); use layers = 1 for a projection"
            ]
        return []

    def in_width(self, args: Args) -> int:
        return c.int_arg(args, "in")

    def out_width(self, args: Args) -> int:
        return c.int_arg(args, "out")

    def _widths(self, args: Args) -> list[int]:
        hidden = c.opt_int_arg(args, "hidden")
        inner = [] if hidden is None else [hidden]
        return [c.int_arg(args, "in"), *inner, c.int_arg(args, "out")]

    def forward_flops(self, args: Args, in_tokens: int) -> float:
        w = self._widths(args)
        return sum(c.matmul_flops(in_tokens, a, b) for a, b in itertools.pairwise(w))

    def layer_params(self, args: Args) -> int:
        w = self._widths(args)
        return sum(c.linear_params(a, b) for a, b in itertools.pairwise(w))

    def activation_elements(self, args: Args, in_tokens: int) -> float:
        hidden = c.opt_int_arg(args, "hidden")
        # The first Linear's input; with a hidden layer also the GELU's input and output.
        inner = 0 if hidden is None else 2 * hidden
        return float(in_tokens) * (c.int_arg(args, "in") + inner)

    def reads_modality(self, args: Args, modality: ModalityInfo) -> str | None:
        if c.modality_form(modality) != "features":
            return (
                f"mlp reads feature modalities only, but '{modality.name}' has no `features`; "
                f"encode it first (a transformer for token ids, a vit for images)"
            )
        return None

    def input_stage_params(self, args: Args, modality: ModalityInfo) -> int:
        assert modality.features is not None, f"mlp cannot read {modality.name}"
        return c.linear_stage_params(modality.features, modality, c.int_arg(args, "in"))

    def build_layer(self, args: Args, *, last: bool = True) -> nn.Module:
        """One layer; ``last`` marks the module's final layer, where ``out_tokens`` pools."""
        from spindle_dsl.kinds.layers import MlpLayer

        return MlpLayer(
            c.int_arg(args, "in"),
            c.int_arg(args, "out"),
            c.opt_int_arg(args, "hidden"),
            out_tokens=c.opt_int_arg(args, "out_tokens") if last else None,
        )

    def build_input_stage(self, args: Args, modality: ModalityInfo) -> nn.Module:
        from spindle_dsl.kinds.layers import LinearStage

        problem = self.reads_modality(args, modality)
        if problem:
            raise TypeError(problem)
        assert modality.features is not None
        return LinearStage(modality.features, modality.tokens, c.int_arg(args, "in"))
