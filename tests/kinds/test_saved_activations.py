"""``Kind.activation_elements`` against what torch really saves for backward in the built layers.

The planner's memory model prices kept activations from the kinds' closed forms, and the runtime
holds whatever autograd saves. Every tensor a layer's forward saves passes through
``saved_tensors_hooks``; counting each distinct storage once (views such as q, k and v of one
projection share it) and leaving out the layer's own parameters gives the elements the layer
keeps per sample, which must equal the kind's formula exactly.
"""

from __future__ import annotations

import pytest
import torch

from spindle_dsl.kinds import get_kind

CASES = [
    ("transformer", {"layers": 2, "hidden": 48, "heads": 4}, 7),
    ("transformer", {"layers": 1, "hidden": 64, "heads": 8, "ffn": 100, "causal": True}, 16),
    ("vit", {"layers": 4, "hidden": 64, "heads": 4, "patch": 4}, 12),
    # the LLaMA/Qwen variants, each alone and together (rotary with and without GQA: GQA
    # repeats k and v, rotary replaces q and k, so what stays alive differs)
    ("transformer", {"layers": 1, "hidden": 48, "heads": 4, "kv_heads": 2}, 7),
    ("transformer", {"layers": 1, "hidden": 48, "heads": 4, "kv_heads": 1, "causal": True}, 9),
    ("transformer", {"layers": 1, "hidden": 48, "heads": 4, "ffn": 80, "act": "swiglu"}, 7),
    ("transformer", {"layers": 1, "hidden": 48, "heads": 4, "norm": "rmsnorm"}, 7),
    ("transformer", {"layers": 1, "hidden": 48, "heads": 4, "bias": False}, 7),
    ("transformer", {"layers": 1, "hidden": 48, "heads": 4, "bias": False, "qkv_bias": True}, 5),
    ("transformer", {"layers": 1, "hidden": 48, "heads": 4, "pos": "rotary"}, 7),
    ("transformer", {"layers": 1, "hidden": 48, "heads": 4, "pos": "rotary", "kv_heads": 2}, 7),
    (
        "transformer",
        {
            "layers": 2,
            "hidden": 64,
            "heads": 8,
            "kv_heads": 2,
            "ffn": 96,
            "act": "swiglu",
            "norm": "rmsnorm",
            "bias": False,
            "qkv_bias": True,
            "pos": "rotary",
            "causal": True,
        },
        11,
    ),
    ("vit", {"layers": 1, "hidden": 48, "heads": 4, "patch": 4, "norm": "rmsnorm"}, 9),
    ("vit", {"layers": 1, "hidden": 48, "heads": 6, "kv_heads": 3, "act": "swiglu"}, 9),
    ("mlp", {"in": 64, "out": 96}, 5),
    ("mlp", {"in": 24, "out": 24, "hidden": 40, "layers": 3}, 9),
    ("resampler", {"in": 40, "hidden": 32, "heads": 4, "out_tokens": 5}, 11),
    ("resampler", {"in": 32, "hidden": 32, "heads": 2, "out_tokens": 3, "ffn": 48}, 6),
]


def saved_elements(layer: torch.nn.Module, x: torch.Tensor) -> int:
    """Elements of the distinct non-parameter storages the forward of ``layer`` saves."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params)


def batch_free(kind, args, tokens: int) -> float:
    """Saved elements that do not grow with the batch (rotary's cos/sin tables)."""
    block = getattr(kind, "block", None)
    return block(args).batch_free_activations(tokens) if block is not None else 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("name", "given", "tokens"), CASES)
def test_activation_elements_are_what_autograd_saves(name, given, tokens, dtype) -> None:
    kind = get_kind(name)
    args = kind.resolve(given)
    # an inner layer: the module's last layer may also pool its tokens (see docs/memory.md)
    layer = kind.build_layer(args, last=False).to(dtype)
    fixed = batch_free(kind, args, tokens)
    for batch in (1, 3):  # two batch sizes: the per-sample count is the slope, exactly
        x = torch.randn(batch, tokens, kind.in_width(args), dtype=dtype, requires_grad=True)
        expected = batch * kind.activation_elements(args, tokens) + fixed
        assert saved_elements(layer, x) == expected
