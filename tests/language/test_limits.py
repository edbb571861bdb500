"""Limits: every number of a spec within what a real job can have, refused at its place."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from spindle_dsl.errors import SpecError
from spindle_dsl.kinds import base as kinds_base
from spindle_dsl.kinds.base import ArgSpec, Kind
from spindle_dsl.language import compile_text, limits

_spec = importlib.util.spec_from_file_location(
    "lang_helpers", Path(__file__).with_name("helpers.py")
)
h = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(h)

LANGUAGE_DOCS = Path(__file__).resolve().parents[2] / "docs" / "language.md"


def edit(old: str, new: str, text: str = h.BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


CLUSTER = "cluster { devices = 4 }\n"


@pytest.mark.parametrize(
    ("old", "new", "key", "words"),
    [
        (CLUSTER, "cluster { devices = 99999999999 }\n", "devices", ["at most 65,536"]),
        (CLUSTER, "cluster { devices_per_node = 4096 }\n", "devices_per_node", ["1,024"]),
        (CLUSTER, "cluster { tflops = 1e9 }\n", "tflops", ["at most"]),
        (CLUSTER, "cluster { tflops = 0.0000001 }\n", "tflops", ["at least"]),
        (CLUSTER, "cluster { memory = 1000000GB }\n", "memory", ["16,384 GiB"]),
        (CLUSTER, "cluster { memory = 1KB }\n", "memory", ["at least"]),
        (CLUSTER, "cluster { inter_bandwidth = 1000000000GB/s }\n", "inter_bandwidth", ["at most"]),
        (CLUSTER, "cluster { intra_bandwidth = 0.001Gb/s }\n", "intra_bandwidth", ["at least"]),
        ("tokens = 16 }", "tokens = 99999999999 }", "tokens", ["1,048,576"]),
        ("vocab = 100 }", "vocab = 65536000 }", "vocab", ["4,194,304"]),
        ("layers = 2, hidden = 32", "layers = 65536, hidden = 32", "layers", ["4,096"]),
        ("patch = 4", "patch = 65536", "patch", ["1,024"]),
        ("mlp(in = 32, out = 64)", "mlp(in = 32, out = 64, hidden = 1000000)", "hidden = 1",
         ["131,072"]),
        ("heads = 2, causal", "heads = 65536, causal", "heads = 6", ["1,024"]),
        ("global_batch = 8", "global_batch = 1000000000", "global_batch", ["16,777,216"]),
        ("caption = 1;", "caption = 1e9;", "caption = 1e9", ["weight", "at most"]),
        ("task chat    { text -> lm }", "task chat    { text[99999999999] -> lm }",
         "99999999999", ["token count", "1,048,576"]),
    ],
)  # fmt: skip
def test_a_number_past_its_limit_is_an_error_at_its_place(old, new, key, words):
    text = edit(old, new, CLUSTER + h.BASE)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if key in row)
    column = text.splitlines()[line - 1].index(key) + 1
    errors = [e for e in h.errors_of(text) if all(w in e.message for w in words)]
    assert errors, [e.message for e in h.errors_of(text)]
    assert h.where(errors[0]) == (line, column), errors[0].message


def test_every_limit_is_reported_in_one_run():
    text = edit("tokens = 16 }", "tokens = 2000000 }", CLUSTER + h.BASE)
    text = edit("layers = 2, hidden = 64", "layers = 10000, hidden = 64", text)
    text = edit("global_batch = 8", "global_batch = 100000000", text)
    lines = [h.where(e)[0] for e in h.errors_of(text)]
    assert lines == [2, 6, 9]


def test_a_batch_without_a_mix_is_bounded_too():
    text = "modality t { tokens = 4; vocab = 9 }\n"
    text += "shared m : transformer(layers = 1, hidden = 8, heads = 2, causal = true, vocab = 9)\n"
    text += "task a { batch = 100000000; t -> m }\n"
    error = h.first_error(text)
    assert h.where(error) == (3, 10) and "batch" in error.message


def test_the_widest_model_has_its_default_ffn_within_bounds():
    text = "modality t { tokens = 4; vocab = 9 }\n"
    text += "shared m : transformer(layers = 1, hidden = 131072, heads = 2, causal = true, "
    text += "vocab = 9)\ntask a { batch = 2; t -> m }\n"
    (op,) = compile_text(text).graph.metaops  # ffn = 4 x 131072 = 524,288, its bound
    assert dict(op.args)["ffn"] == limits.FFN.high


def test_command_line_overrides_are_bounded():
    with pytest.raises(SpecError) as err:
        compile_text(h.BASE, cluster_overrides={"devices": 100_000})
    assert "--devices must be at most 65,536" in err.value.errors[0].message
    with pytest.raises(SpecError) as err:
        compile_text(h.BASE, cluster_overrides={"peak_flops": 1e30})
    assert "--tflops" in err.value.errors[0].message


def test_numbers_at_their_limits_compile():
    text = (
        "cluster { devices = 65536; devices_per_node = 1024; tflops = 100000; memory = 16384GB;"
        " intra_bandwidth = 100000GB/s; inter_bandwidth = 0.001GB/s }\n"
        "modality text { tokens = 1048576; vocab = 4194304 }\n"
        "shared lm : transformer(layers = 4096, hidden = 131072, heads = 1024, causal = true,"
        " vocab = 4194304)\n"
        "task a { text -> lm }\ntask b { text[1] -> lm }\n"
        "mix m { global_batch = 16777216; a = 1000000; b = 0.000001 }\n"
    )
    graph = compile_text(text).graph
    (op,) = graph.metaops  # b gets no samples
    assert op.batch == 16_777_216 and op.layers == 4096


class _Wide(Kind):
    """A user kind whose arguments share names with the built-in kinds, plus its own."""

    name = "wide"
    schema = (
        ArgSpec("layers", int, 1),
        ArgSpec("hidden", int),
        ArgSpec("kv_heads", int, 1),
        ArgSpec("pad", int, 0, minimum=0),
        ArgSpec("scale", float, 1.0, minimum=None),
        ArgSpec("inner", int, lambda a: 1 << 30),
    )

    def in_width(self, args):
        return args["hidden"]

    def out_width(self, args):
        return args["hidden"]

    def forward_flops(self, args, in_tokens):
        return 2.0 * in_tokens * args["hidden"] ** 2

    def layer_params(self, args):
        return args["hidden"] ** 2

    def activation_elements(self, args, in_tokens):
        return float(in_tokens * args["hidden"])

    def build_layer(self, args):
        raise NotImplementedError


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setitem(kinds_base._REGISTRY, "wide", _Wide())


WIDE = (
    "modality x { tokens = 4; features = 3 }\n"
    "encoder w : wide(ARGS) <- x\n"
    "task a { batch = 2; x -> w; loss = mse }\n"
)


@pytest.mark.parametrize(
    ("args", "at", "words"),  # at: where the error points (the argument, or the kind's name)
    [
        ("hidden = 1000000, inner = 8", "hidden", ["'hidden' of wide()", "131,072"]),
        ("hidden = 8, kv_heads = 5000, inner = 8", "kv_heads", ["kv_heads", "1,024"]),
        ("hidden = 8, pad = 99999999, inner = 8", "pad", ["'pad'", "16,777,216"]),
        ("hidden = 8, scale = 1e15, inner = 8", "scale", ["'scale'", "at most"]),
        ("hidden = 8", "wide", ["'inner' of wide() (its default)", "16,777,216"]),
    ],
)
def test_kind_arguments_are_bounded_by_name_and_type(wide, args, at, words):
    text = WIDE.replace("ARGS", args)
    error = h.first_error(text)
    assert h.where(error) == (2, text.splitlines()[1].index(at) + 1), error.message
    for word in words:
        assert word in error.message


def test_a_kind_keeps_its_own_minimums_and_may_register_bounds(wide, monkeypatch):
    compile_text(WIDE.replace("ARGS", "hidden = 8, pad = 0, scale = -2.5, inner = 8"))
    monkeypatch.setitem(limits._ARGS, "inner", limits.Limit(1, 64, "inner is at most 64 here"))
    error = h.first_error(WIDE.replace("ARGS", "hidden = 8, inner = 65"))
    assert "inner is at most 64 here" in error.message
    limits.register_arg_limit("pad", limits.Limit(0, 3, "pad is small"))
    try:
        assert (
            "pad is small"
            in h.first_error(WIDE.replace("ARGS", "hidden = 8, pad = 4, inner = 8")).message
        )
    finally:
        del limits._ARGS["pad"]


def test_the_language_reference_documents_every_bound():
    text = LANGUAGE_DOCS.read_text().replace(",", "")
    for name, limit in limits.table():
        shown = limit._show(limit.high).replace(",", "").split()[0]
        assert shown in text, (name, shown)


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ("tokens = 77 ", "tokens = 99999999999 ", ["tokens", "1,048,576"]),
        ("devices          = 32", "devices          = 99999999999", ["devices", "65,536"]),
        ("patch = 14) <- image", "patch = 99999999999) <- image", ["patch", "1,024"]),
        ("layers = 32, hidden = 1280", "layers = 65536, hidden = 1280", ["layers", "4,096"]),
        ("layers = 32, hidden = 1280", "layers = 1000000, hidden = 1280", ["layers", "4,096"]),
        ("layers = 32, hidden = 1280", "layers = 99999999999, hidden = 1280", ["layers"]),
    ],
)
def test_values_past_the_bounds_are_errors_at_their_place(spec_dir, old, new, words):
    """Edits of multitask_clip past the language's bounds (tokens, devices, patch, layers):
    each is an error at its line naming the bound, where planning on would end in a KeyError,
    a MemoryError, an OverflowError or a plan that never finishes."""
    text = (spec_dir / "multitask_clip.spindle").read_text()
    assert old in text
    error = h.first_error(text.replace(old, new, 1))
    line = next(i for i, row in enumerate(text.replace(old, new, 1).splitlines(), 1) if new in row)
    assert error.span is not None and error.span.line == line
    for word in words:
        assert word in error.message
