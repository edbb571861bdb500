"""Pin each built-in kind's FLOPs and parameters three ways: the kind's own formula, an
independent closed form written here, and the PyTorch layer itself (parameter count and
torch's FLOP counter). All three must agree exactly."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import ModalityInfo

CASES = [
    ("transformer", {"layers": 2, "hidden": 48, "heads": 4}),
    ("transformer", {"layers": 1, "hidden": 64, "heads": 8, "ffn": 100, "causal": True}),
    ("transformer", {"layers": 3, "hidden": 32, "heads": 2, "causal": True, "vocab": 50}),
    ("vit", {"layers": 4, "hidden": 64, "heads": 4, "patch": 4}),
    ("vit", {"layers": 1, "hidden": 40, "heads": 5, "ffn": 72, "patch": 3, "out_tokens": 2}),
    ("mlp", {"in": 64, "out": 96}),
    ("mlp", {"in": 24, "out": 24, "hidden": 40, "layers": 3}),
    ("resampler", {"in": 40, "hidden": 32, "heads": 4, "out_tokens": 5}),
    ("resampler", {"in": 32, "hidden": 32, "heads": 2, "out_tokens": 3, "layers": 2}),
]


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def independent_params(kind: str, a: dict) -> int:
    """Closed forms written out in full, not built from the package's helpers."""
    if kind in ("transformer", "vit"):
        h, f = a["hidden"], a["ffn"]
        return 4 * h * h + 2 * h * f + 9 * h + f
    if kind == "mlp":
        if a.get("hidden") is None:
            return a["in"] * a["out"] + a["out"]
        return a["in"] * a["hidden"] + a["hidden"] + a["hidden"] * a["out"] + a["out"]
    i, h, f, q = a["in"], a["hidden"], a["ffn"], a["out_tokens"]
    return q * h + 2 * i + 2 * i * h + 2 * h * h + 2 * h * f + 9 * h + f


def independent_flops(kind: str, a: dict, t: int) -> float:
    if kind in ("transformer", "vit"):
        h, f = a["hidden"], a["ffn"]
        return 8 * t * h * h + 4 * t * t * h + 4 * t * h * f
    if kind == "mlp":
        if a.get("hidden") is None:
            return 2 * t * a["in"] * a["out"]
        return 2 * t * a["hidden"] * (a["in"] + a["out"])
    i, h, f, q = a["in"], a["hidden"], a["ffn"], a["out_tokens"]
    return 4 * q * h * h + 4 * t * i * h + 4 * q * t * h + 4 * q * h * f


@pytest.mark.parametrize(("name", "given"), CASES)
def test_params_agree_with_formula_and_layer(name: str, given: dict) -> None:
    kind = get_kind(name)
    assert kind.check_args(given) == []
    args = kind.resolve(given)
    assert kind.layer_params(args) == independent_params(name, args)
    assert kind.layer_params(args) == numel(kind.build_layer(args))


@pytest.mark.parametrize(("name", "given"), CASES)
@pytest.mark.parametrize("tokens", [1, 7])
def test_flops_agree_with_formula_and_torch_counter(name: str, given: dict, tokens: int) -> None:
    kind = get_kind(name)
    args = kind.resolve(given)
    expected = independent_flops(name, args, tokens)
    assert kind.forward_flops(args, tokens) == pytest.approx(expected, rel=1e-12)
    layer = kind.build_layer(args)
    x = torch.randn(3, tokens, kind.in_width(args))
    # The math backend decomposes attention into matmuls the counter sees; it counts 2 FLOPs
    # per MAC and the full attention matrix even when causal, as the kinds do.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = layer(x)
    assert counter.get_total_flops() == pytest.approx(3 * expected, rel=1e-12)
    assert out.shape == (3, kind.out_tokens(args, tokens), kind.out_width(args))


IMAGE = ModalityInfo("image", tokens=16)
AUDIO = ModalityInfo("audio", tokens=24, features=20)
TEXT = ModalityInfo("text", tokens=12, vocab=50)


@pytest.mark.parametrize(
    ("name", "given", "modality", "expected"),
    [
        ("transformer", {"layers": 1, "hidden": 32, "heads": 2}, TEXT, 50 * 32 + 12 * 32),
        ("transformer", {"layers": 1, "hidden": 32, "heads": 2}, AUDIO, 20 * 32 + 32 + 24 * 32),
        ("vit", {"layers": 1, "hidden": 64, "heads": 4, "patch": 4}, IMAGE, 48 * 64 + 64 + 16 * 64),
        ("mlp", {"in": 16, "out": 8}, AUDIO, 20 * 16 + 16 + 24 * 16),
        (
            "resampler",
            {"in": 16, "hidden": 8, "heads": 2, "out_tokens": 3},
            AUDIO,
            20 * 16 + 16 + 24 * 16,
        ),
    ],
)
def test_input_stage_params_and_shapes(name, given, modality, expected) -> None:
    kind = get_kind(name)
    args = kind.resolve(given)
    assert kind.reads_modality(args, modality) is None
    assert kind.input_stage_params(args, modality) == expected
    stage = kind.build_input_stage(args, modality)
    assert numel(stage) == expected
    if modality.vocab is not None:
        raw = torch.randint(0, modality.vocab, (2, modality.tokens))
    else:
        width = modality.features or 3 * int(args["patch"]) ** 2
        raw = torch.randn(2, modality.tokens, width)
    assert stage(raw).shape == (2, modality.tokens, kind.in_width(args))


def test_lm_head_only_for_causal_transformer_with_vocab() -> None:
    kind = get_kind("transformer")
    lm = kind.resolve({"layers": 1, "hidden": 32, "heads": 2, "causal": True, "vocab": 50})
    assert kind.head_params(lm) == 2 * 32 + 32 * 50
    head = kind.build_head(lm)
    assert head is not None and numel(head) == kind.head_params(lm)
    assert head(torch.randn(2, 5, 32)).shape == (2, 5, 50)
    encoder = kind.resolve({"layers": 1, "hidden": 32, "heads": 2, "vocab": 50})
    assert kind.head_params(encoder) == 0 and kind.build_head(encoder) is None
    vit = get_kind("vit")
    assert vit.build_head(vit.resolve({"layers": 1, "hidden": 8, "heads": 2, "patch": 2})) is None
