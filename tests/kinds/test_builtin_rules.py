"""Argument schemas, cross-argument rules, modality rules and shape semantics of the kinds."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import pytest
import torch

from spindle_dsl.kinds import ArgSpec, Kind, get_kind, kind_names, register_kind
from spindle_dsl.metagraph import ModalityInfo

IMAGE = ModalityInfo("image", tokens=16)
AUDIO = ModalityInfo("audio", tokens=24, features=20)
TEXT = ModalityInfo("text", tokens=12, vocab=512)


def messages(name: str, given: dict) -> str:
    return " | ".join(msg for _, msg in get_kind(name).check_args(given))


def test_all_four_builtins_are_registered() -> None:
    assert {"transformer", "vit", "mlp", "resampler"} <= set(kind_names())


def test_defaults_fill_in() -> None:
    t = get_kind("transformer").resolve({"layers": 2, "hidden": 48, "heads": 4})
    assert t["ffn"] == 192 and t["causal"] is False and "vocab" not in t
    m = get_kind("mlp").resolve({"in": 4, "out": 5})
    assert m["layers"] == 1 and "hidden" not in m
    r = get_kind("resampler").resolve({"in": 4, "hidden": 8, "heads": 2, "out_tokens": 3})
    assert r["layers"] == 1 and r["ffn"] == 32


@pytest.mark.parametrize(
    ("name", "given", "words"),
    [
        ("transformer", {"layers": 2, "hidden": 50, "heads": 4}, ["divisible", "heads"]),
        ("vit", {"layers": 2, "hidden": 64, "heads": 4}, ["needs", "patch"]),
        ("vit", {"layers": 2, "hidden": 64, "heads": 4, "patch": 0}, ["at least"]),
        ("mlp", {"in": 4, "out": 8, "layers": 2}, ["in (4) must equal out (8)"]),
        ("resampler", {"in": 4, "hidden": 8, "heads": 2}, ["needs", "out_tokens"]),
        (
            "resampler",
            {"in": 4, "hidden": 8, "heads": 2, "out_tokens": 3, "layers": 2},
            ["in (4) must equal hidden (8)"],
        ),
        ("transformer", {"layers": 2, "hidden": 8, "heads": 2, "causal": 1}, ["must be bool"]),
        ("mlp", {"in": 4, "out": 4, "widht": 3}, ["no argument 'widht'"]),
    ],
)
def test_bad_arguments_are_named(name: str, given: dict, words: list[str]) -> None:
    text = messages(name, given)
    for word in words:
        assert word in text


def test_good_arguments_pass() -> None:
    assert messages("transformer", {"layers": 1, "hidden": 8, "heads": 2, "causal": True}) == ""
    assert messages("mlp", {"in": 4, "out": 4, "hidden": 9, "layers": 3}) == ""
    assert (
        messages("vit", {"layers": 1, "hidden": 8, "heads": 2, "patch": 2, "out_tokens": 1}) == ""
    )


def test_widths_and_tokens() -> None:
    t = get_kind("transformer")
    a = t.resolve({"layers": 1, "hidden": 8, "heads": 2})
    assert (t.in_width(a), t.out_width(a), t.out_tokens(a, 13)) == (8, 8, 13)
    m = get_kind("mlp")
    a = m.resolve({"in": 4, "out": 6, "out_tokens": 3})
    assert (m.in_width(a), m.out_width(a), m.out_tokens(a, 13)) == (4, 6, 3)
    r = get_kind("resampler")
    a = r.resolve({"in": 4, "hidden": 8, "heads": 2, "out_tokens": 5})
    assert (r.in_width(a), r.out_width(a), r.out_tokens(a, 100)) == (4, 8, 5)


@pytest.mark.parametrize(
    ("name", "given", "ok", "bad"),
    [
        ("transformer", {"layers": 1, "hidden": 8, "heads": 2}, [TEXT, AUDIO], [IMAGE]),
        ("vit", {"layers": 1, "hidden": 8, "heads": 2, "patch": 2}, [IMAGE], [TEXT, AUDIO]),
        ("mlp", {"in": 4, "out": 4}, [AUDIO], [TEXT, IMAGE]),
        ("resampler", {"in": 4, "hidden": 8, "heads": 2, "out_tokens": 2}, [AUDIO], [TEXT, IMAGE]),
    ],
)
def test_which_modalities_each_kind_reads(name, given, ok, bad) -> None:
    kind = get_kind(name)
    args = kind.resolve(given)
    for modality in ok:
        assert kind.reads_modality(args, modality) is None
    for modality in bad:
        problem = kind.reads_modality(args, modality)
        assert problem and modality.name in problem
        with pytest.raises(TypeError):
            kind.build_input_stage(args, modality)


def test_transformer_vocab_must_match_modality() -> None:
    kind = get_kind("transformer")
    args = kind.resolve({"layers": 1, "hidden": 8, "heads": 2, "vocab": 100})
    problem = kind.reads_modality(args, TEXT)
    assert problem and "100" in problem and "512" in problem


def test_out_tokens_pools_in_the_last_layer_only() -> None:
    kind = get_kind("transformer")
    args = kind.resolve({"layers": 2, "hidden": 8, "heads": 2, "out_tokens": 3})
    x = torch.randn(2, 12, 8)
    inner = kind.build_layer(args, last=False)
    last = kind.build_layer(args, last=True)
    assert inner(x).shape == (2, 12, 8)
    assert last(inner(x)).shape == (2, 3, 8)
    # Pooling is a plain average of consecutive tokens: 12 -> 3 groups of 4.
    mlp = get_kind("mlp")
    margs = mlp.resolve({"in": 8, "out": 8, "out_tokens": 3})
    layer = mlp.build_layer(margs)
    y = layer.net(x)
    assert torch.allclose(layer(x), y.view(2, 3, 4, 8).mean(dim=2), atol=1e-6)


def test_causal_attention_ignores_later_tokens() -> None:
    kind = get_kind("transformer")
    layer = kind.build_layer(kind.resolve({"layers": 1, "hidden": 8, "heads": 2, "causal": True}))
    x = torch.randn(1, 6, 8)
    changed = x.clone()
    changed[:, 4:] += 1.0
    assert torch.allclose(layer(x)[:, :4], layer(changed)[:, :4], atol=1e-6)
    assert not torch.allclose(layer(x)[:, 4:], layer(changed)[:, 4:])


def test_position_table_rejects_overlong_input() -> None:
    kind = get_kind("transformer")
    stage = kind.build_input_stage(kind.resolve({"layers": 1, "hidden": 8, "heads": 2}), TEXT)
    with pytest.raises(ValueError, match="position table"):
        stage(torch.randint(0, 512, (1, 13)))


def test_user_kind_registers_and_is_found() -> None:
    class Scale(Kind):
        name: ClassVar[str] = "test_scale_kind"
        schema: ClassVar[tuple[ArgSpec, ...]] = (
            ArgSpec("width", int),
            ArgSpec("layers", int, 1),
        )

        def in_width(self, args):
            return args["width"]

        def out_width(self, args):
            return args["width"]

        def forward_flops(self, args, in_tokens):
            return 2.0 * in_tokens * args["width"] ** 2

        def layer_params(self, args):
            return args["width"] ** 2

        def activation_elements(self, args, in_tokens):
            return float(in_tokens * args["width"])

        def build_layer(self, args):
            return torch.nn.Linear(args["width"], args["width"], bias=False)

    register_kind(Scale)
    kind = get_kind("test_scale_kind")
    assert "test_scale_kind" in kind_names()
    assert kind.check_args({"width": 4}) == []
    assert kind.layer_params(kind.resolve({"width": 4})) == 16


def test_importing_kinds_does_not_import_torch() -> None:
    code = (
        "import sys; from spindle_dsl.kinds import get_kind; get_kind('vit'); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
