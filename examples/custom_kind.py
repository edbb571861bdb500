"""Add a layer kind from Python and use it in a spec at once.

Run: ``python examples/custom_kind.py``. It registers a SwiGLU feed-forward kind, compiles a
spec that uses it as an adapter, plans the spec on 4 CPU devices and trains the whole model
for a few steps in one process (the runtime's reference model), printing the losses.
"""

from __future__ import annotations

import torch
from torch import nn

from spindle_dsl.backends.torch.reference import ReferenceModel
from spindle_dsl.cost import make_cost_model
from spindle_dsl.kinds import ArgSpec, Kind, register_kind
from spindle_dsl.language import compile_text
from spindle_dsl.planner import make_plan


class SwiGLULayer(nn.Module):
    """x + W2 (silu(W1 x) * W3 x): a gated feed-forward block with a residual."""

    def __init__(self, width: int, inner: int):
        super().__init__()
        self.gate = nn.Linear(width, inner, bias=False)
        self.up = nn.Linear(width, inner, bias=False)
        self.down = nn.Linear(inner, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.silu(self.gate(x)) * self.up(x))


@register_kind
class SwiGLU(Kind):
    """The kind: its arguments, shapes, costs and the layer above."""

    name = "swiglu"
    schema = (ArgSpec("layers", int), ArgSpec("width", int), ArgSpec("inner", int))

    def in_width(self, args):
        return args["width"]

    def out_width(self, args):
        return args["width"]

    def forward_flops(self, args, tokens):
        return 2.0 * tokens * 3 * args["width"] * args["inner"]  # three matmuls

    def layer_params(self, args):
        return 3 * args["width"] * args["inner"]

    def activation_elements(self, args, tokens):
        return tokens * (args["width"] + 3 * args["inner"])

    def build_layer(self, args):
        return SwiGLULayer(args["width"], args["inner"])


SPEC = """
cluster { devices = 4; device = "cpu" }
modality image { tokens = 16 }
modality text  { tokens = 12  vocab = 256 }
encoder vision : vit(layers = 2, hidden = 32, heads = 2, patch = 4) <- image
module  adapter : swiglu(layers = 2, width = 32, inner = 64)
shared  lm : transformer(layers = 2, hidden = 32, heads = 2, causal = true, vocab = 256)
task caption { image -> vision -> adapter -> lm; text -> lm }
task chat    { text -> lm }
mix default  { global_batch = 16; caption = 1; chat = 1 }
"""


def main() -> None:
    graph = compile_text(SPEC, "custom_kind.spindle").graph
    adapter = graph.op("caption/adapter")
    print(f"{adapter.id}: {adapter.layers} layers, {adapter.params_per_layer} params per layer")
    plan = make_plan(graph, make_cost_model(graph.cluster))
    print(f"plan: {len(plan.waves)} waves, {plan.iteration_s * 1e3:.2f} ms predicted")
    for step, losses in enumerate(ReferenceModel(graph).train(3), 1):
        print(f"step {step}: " + ", ".join(f"{t} {v:.4f}" for t, v in losses.items()))


if __name__ == "__main__":
    main()
