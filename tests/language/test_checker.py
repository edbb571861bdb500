"""Semantic checks: every error at its place, with its suggestion, all in one run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from spindle_dsl.errors import SpecError
from spindle_dsl.kinds import base as kinds_base
from spindle_dsl.kinds.base import REQUIRED, ArgSpec, Kind
from spindle_dsl.language import compile_text

_spec = importlib.util.spec_from_file_location(
    "lang_helpers", Path(__file__).with_name("helpers.py")
)
h = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(h)


def edit(old: str, new: str, text: str = h.BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_base_spec_compiles_without_warnings():
    compiled = compile_text(h.BASE)
    assert compiled.warnings == ()
    assert [t.name for t in compiled.graph.tasks] == ["caption", "chat"]


# (text to replace in BASE, replacement, line, column of the first error, words in it)
T = "task chat    { text -> lm }"
M = "modality text  { tokens = 8; vocab = 100 }"
SEMANTIC = [
    ("vit(layers", "vitt(layers", 3, 18, "unknown kind 'vitt'|did you mean 'vit'"),
    ("heads = 2, patch", "heads = 2, pach = 4, patch", 3, 58, "'pach'|did you mean 'patch'"),
    ("mlp(in = 32, out = 64)", "mlp(in = 32, in = 3, out = 64)", 4, 31, "given twice"),
    ("mlp(in = 32, out = 64)", "mlp(in = 32, out = 64GB)", 4, 37, "units"),
    ("hidden = 32, heads = 2", "hidden = 32, heads = 3", 3, 18, "divisible"),
    ("<- image", "", 3, 9, "needs the modality"),
    ("<- image", "<- imgae", 3, 72, "unknown modality 'imgae'|did you mean 'image'"),
    ("mlp(in = 32, out = 64)", "mlp(in = 32, out = 64) <- text", 4, 44, "plain module"),
    ("<- image", "<- text", 3, 72, "vit reads raw images only"),
    ("vocab = 100)", "vocab = 101)", 6, 47, "vocab = 101|vocab = 100"),
    ("-> proj -> lm", "-> proj -> lm -> text", 6, 49, "can only start a path"),
    ("text -> lm }\ntask chat", "proj[3] -> lm; text -> lm }\ntask chat", 6, 52, "to a modality"),
    (T, "task chat { text[4] -> lm; text[5] -> lm }", 7, 33, "5 tokens here but 4 on line 7"),
    (T, "task chat { loss = lm }", 7, 6, "no path"),
    (T, "task chat { text -> lm; bacth = 2 }", 7, 25, "did you mean 'batch'"),
    (T, "task chat { text -> lm; loss = ml }", 7, 32, "did you mean 'lm'"),
    (T, "task chat { text -> proj; loss = mse }", 7, 13, "mlp reads feature"),
    (T, "task chat { text -> lm -> lm }", 7, 21, "cycle|lm -> lm"),
    (T, "task chat { proj -> lm; text -> lm }", 7, 13, "'proj' has no input"),
    (T, "task chat { text -> lm; loss = contrastive }", 7, 25, "two sinks"),
    (T, "task chat { image -> vision }", 7, 6, "must say its loss"),
    (T, "task chat { image -> vision -> proj -> lm }", 7, 40, "no modality with a vocab"),
    (T, "task chat { text -> caption }", 7, 21, "is a task"),
    (T, T + "\ntask chat { text -> lm }", 8, 6, "duplicate name 'chat'|line 7"),
    ("global_batch = 8;", "", 8, 5, "needs 'global_batch"),
    ("chat = 1 }", "chat = 0 }", 8, 46, "greater than 0"),
    ("chat = 1 }", "chat = 1; chat = 2 }", 8, 56, "set twice"),
    ("caption = 1; chat = 1", "", 8, 5, "no task a weight"),
    (M, "modality text { tokens = 8; vocab = 100; features = 3 }", 2, 42, "not both"),
    (M, "modality text { vocab = 100 }", 2, 10, "needs 'tokens"),
    (M, "modality text { tokens = 8.5; vocab = 100 }", 2, 26, "whole number"),
    (M, "modality text { tokens = 8; vocab = 100; vocb = 3 }", 2, 42, "did you mean 'vocab'"),
]


@pytest.mark.parametrize(("old", "new", "line", "column", "words"), SEMANTIC)
def test_semantic_error(old, new, line, column, words):
    text = edit(old, new)
    first = h.first_error(text)
    assert h.where(first) == (line, column), first.render(text)
    for word in words.split("|"):
        assert word in first.message, first.render(text)


def test_a_token_count_on_a_modality_is_fine():
    graph = compile_text(edit("image -> vision", "image[4] -> vision")).graph
    assert graph.op("caption/vision").tokens == 4


@pytest.mark.parametrize(
    ("block", "column", "words"),
    [
        ("cluster { devices = 0 }", 11, ["at least 1"]),
        (
            'cluster { device = "A100-80G" }',
            20,
            ["unknown device preset", "did you mean 'A100-80GB'"],
        ),
        ("cluster { devcies = 4 }", 11, ["did you mean 'devices'"]),
        ("cluster { memory = 80 }", 20, ["needs a unit"]),
        ("cluster { memory = 80GB/s }", 20, ["is a rate"]),
        ("cluster { intra_bandwidth = 300GB }", 29, ["is a size"]),
        ("cluster { devices = 4; devices_per_node = 8 }", 24, ["exceeds"]),
        ("cluster { tflops = -3 }", 11, ["greater than 0"]),
    ],
)
def test_cluster_errors(block, column, words):
    first = h.first_error(block + "\n" + h.BASE)
    assert h.where(first) == (1, column), first.message
    for word in words:
        assert word in first.message


def test_second_cluster_block():
    first = h.first_error("cluster { devices = 2 }\n" + h.BASE + "cluster { devices = 4 }\n")
    assert h.where(first) == (10, 1) and "second" in first.message


def test_all_independent_errors_in_one_run_in_source_order():
    text = edit("vit(layers", "vitt(layers")
    text = edit("task chat    { text -> lm }", "task chat { text -> lmm; batch = 0 }", text)
    text = edit("chat = 1 }", "chta = 1 }", text)
    errors = h.errors_of(text)
    messages = [e.message for e in errors]
    assert [h.where(e)[0] for e in errors] == [3, 7, 7, 8]
    assert "unknown kind 'vitt'" in messages[0]
    assert "unknown module 'lmm' (did you mean 'lm'?)" in messages[1]
    assert "batch of task 'chat' must be at least 1" in messages[2]
    assert "unknown task 'chta' in mix 'default' (did you mean 'chat'?)" in messages[3]


def test_a_broken_module_is_reported_once_not_at_every_use():
    text = edit("mlp(in = 32, out = 64)", "mlp(in = 32, out = -1)")
    errors = h.errors_of(text)
    assert len(errors) == 1 and "'out'" in errors[0].message


def test_width_mismatch_is_reported_once_per_edge():
    text = edit("mlp(in = 32, out = 64)", "mlp(in = 32, out = 48)")
    text = edit(
        "task chat    { text -> lm }",
        "task chat { image -> vision -> proj -> lm; text -> lm }",
        text,
    )
    (error,) = h.errors_of(text)
    assert h.where(error) == (6, 35) and "48" in error.message and "64" in error.message


def test_warnings_come_in_the_same_form():
    text = h.BASE.replace("mix default { global_batch = 8; caption = 1; chat = 1 }", "")
    text += "modality audio { tokens = 3; features = 2 }\nmodule spare : mlp(in = 2, out = 2)\n"
    text = text.replace("task chat    { text -> lm }", "task chat { text -> lm; batch = 2 }")
    text = text.replace(
        "task caption { image -> vision -> proj -> lm; text -> lm }",
        "task caption { image -> vision -> proj -> lm; text -> lm; batch = 2 }",
    )
    compiled = compile_text(text, "w.spindle")
    rendered = compiled.render_warnings()
    assert "w.spindle:9:10: warning: modality 'audio' is not used by any task" in rendered
    assert "w.spindle:10:8: warning: module 'spare' is not used by any task" in rendered
    assert "^^^^^" in rendered


def test_shared_module_used_by_one_task_warns():
    text = edit("task chat    { text -> lm }", "task chat { text -> vision; loss = mse }")
    error = h.first_error(text)  # an encoder reads the modality it is bound to, no other
    assert "encoder 'vision' reads modality 'image', not 'text'" in error.message
    text = edit("task chat    { text -> lm }", "")
    text = edit("; chat = 1", "", text)
    compiled = compile_text(text)
    (warning,) = compiled.warnings
    assert "shared module 'lm' is used only by task 'caption'" in warning.message


def test_mix_leaves_a_task_out_with_a_warning_and_it_is_dropped():
    text = edit("caption = 1; chat = 1", "caption = 1")
    compiled = compile_text(text)
    assert [t.name for t in compiled.graph.tasks] == ["caption"]
    assert any("'chat' is not in mix" in w.message for w in compiled.warnings)
    assert all(op.task == "caption" for op in compiled.graph)


def test_declared_batch_is_ignored_under_a_mix_with_a_warning():
    text = edit("task chat    { text -> lm }", "task chat { text -> lm; batch = 5 }")
    compiled = compile_text(text)
    assert compiled.graph.task("chat").batch == 4
    assert any("ignored" in w.message for w in compiled.warnings)


def test_mix_selection_and_unknown_mix():
    text = h.BASE + "mix other { global_batch = 10; caption = 4; chat = 1 }\n"
    assert compile_text(text).graph.mix == "default"
    graph = compile_text(text, mix="other").graph
    assert (graph.mix, graph.task("caption").batch, graph.task("chat").batch) == ("other", 8, 2)
    error = h.first_error(text, mix="othr")
    assert error.span is None and "did you mean 'other'" in error.message


def test_no_task_at_all_is_an_error():
    assert "no task" in h.first_error("modality m { tokens = 1 }").message
    assert "no task" in h.first_error("").message


def test_cluster_overrides_from_the_command_line():
    graph = compile_text(
        'cluster { devices = 4; device = "cpu" }\n' + h.BASE,
        cluster_overrides={"devices": 32, "device": "H100-80GB", "memory_bytes": 2**30},
    ).graph
    c = graph.cluster
    assert (c.devices, c.devices_per_node, c.device.name, c.device.memory_bytes) == (
        32,
        8,
        "H100-80GB",
        2**30,
    )
    assert graph.dtype_bytes == 2
    error = h.first_error(h.BASE, cluster_overrides={"devices": 0})
    assert "--devices" in error.message
    error = h.first_error(h.BASE, cluster_overrides={"device": "B200"})
    assert "unknown device preset 'B200'" in error.message


class _Echo(Kind):
    """A user kind: ``width``-wide tokens in and out, reads any modality, may blow up."""

    name = "echo"
    schema = (
        ArgSpec("layers", int, 1),
        ArgSpec("width", int, REQUIRED),
        ArgSpec("vocab", int, None),
        ArgSpec("explode", bool, False, minimum=None),
    )

    def in_width(self, args):
        return args["width"]

    def out_width(self, args):
        return args["width"]

    def forward_flops(self, args, in_tokens):
        if args["explode"]:
            raise ZeroDivisionError("boom")
        return 2.0 * in_tokens * args["width"] ** 2

    def layer_params(self, args):
        return args["width"] ** 2

    def activation_elements(self, args, in_tokens):
        return float(in_tokens * args["width"])

    def build_layer(self, args):
        from torch import nn

        return nn.Linear(args["width"], args["width"], bias=False)


@pytest.fixture
def echo_kind(monkeypatch):
    monkeypatch.setitem(kinds_base._REGISTRY, "echo", _Echo())


USER = (
    "modality text { tokens = 4; vocab = 10 }\n"
    "module e : echo(width = 8ARGS)\n"
    "task t { text -> e; batch = 2; loss = mse }\n"
)


def test_user_kinds_work_and_the_vocab_rule_holds_for_them(echo_kind):
    graph = compile_text(USER.replace("ARGS", "")).graph
    assert graph.op("t/e").forward_flops_per_layer == 2.0 * 4 * 64 * 2
    error = h.first_error(USER.replace("ARGS", ", vocab = 11"))
    assert h.where(error) == (3, 10) and "vocab = 11" in error.message


def test_a_user_kind_that_raises_is_a_spec_error(echo_kind):
    with pytest.raises(SpecError, match="kind 'echo' failed computing forward FLOPs"):
        compile_text(USER.replace("ARGS", ", explode = true"))
