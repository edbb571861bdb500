"""Lowering: MetaOps, their figures against closed forms, levels, backward, contraction."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

from spindle_dsl.language import compile_file, compile_text
from spindle_dsl.metagraph import OpInput

_spec = importlib.util.spec_from_file_location(
    "lang_helpers", Path(__file__).with_name("helpers.py")
)
h = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(h)


def block_flops(t: int, hid: int, ffn: int) -> float:
    """Forward FLOPs of one pre-LN attention block for one sample, written out by hand."""
    qkv, scores, mix, proj, mlp = 3 * hid * hid, t * hid, t * hid, hid * hid, 2 * hid * ffn
    return 2.0 * t * (qkv + proj + mlp) + 2.0 * t * (scores + mix)


def block_params(hid: int, ffn: int) -> int:
    """Two LayerNorms, qkv and output projections, and the two-layer MLP, all with biases."""
    return (
        4 * hid
        + (3 * hid * hid + 3 * hid)
        + (hid * hid + hid)
        + (hid * ffn + ffn)
        + (ffn * hid + hid)
    )


@pytest.fixture(scope="module")
def tiny():
    return compile_file(h.EXAMPLES / "tiny_mm.spindle").graph


def test_tiny_metaops_in_level_order(tiny):
    assert [m.id for m in tiny] == [
        "caption/vision",
        "transcribe/hearing",
        "caption/vision_proj",
        "transcribe/audio_proj",
        "caption/lm",
        "transcribe/lm",
    ]
    assert tiny.levels == (
        ("caption/vision", "transcribe/hearing"),
        ("caption/vision_proj", "transcribe/audio_proj"),
        ("caption/lm", "transcribe/lm"),
    )
    assert [(t.name, t.batch, t.weight, t.loss, t.sinks) for t in tiny.tasks] == [
        ("caption", 24, 3.0, "lm", ("caption/lm",)),
        ("transcribe", 8, 1.0, "lm", ("transcribe/lm",)),
    ]


def test_tokens_and_inputs_follow_declaration_order(tiny):
    lm = tiny.op("caption/lm")
    assert lm.inputs == (OpInput("caption/vision_proj", False, 16), OpInput("text", True, 12))
    assert (lm.tokens, lm.out_tokens, lm.deps) == (28, 28, ("caption/vision_proj",))
    other = tiny.op("transcribe/lm")
    assert other.inputs == (OpInput("transcribe/audio_proj", False, 24), OpInput("text", True, 8))
    assert other.tokens == 32


def test_flops_and_parameter_bytes_per_layer(tiny):
    lm = tiny.op("caption/lm")
    assert lm.forward_flops_per_layer == pytest.approx(block_flops(28, 96, 384) * 24)
    assert lm.params_per_layer == block_params(96, 384)
    assert lm.param_bytes_per_layer == block_params(96, 384) * 4  # float32 on the cpu preset
    assert tiny.dtype_bytes == 4
    proj = tiny.op("caption/vision_proj")
    assert proj.forward_flops_per_layer == pytest.approx(2.0 * 16 * 64 * 96 * 24)
    assert proj.params_per_layer == 64 * 96 + 96


def test_module_parameters_count_input_stages_and_head_once(tiny):
    lm = tiny.module("lm")
    embedding = 512 * 96 + 12 * 96  # token table + position table of `text`
    head = 2 * 96 + 96 * 512  # final LayerNorm + LM head without bias
    assert lm.params == 6 * block_params(96, 384) + embedding + head
    assert lm.tasks == ("caption", "transcribe")
    vision = tiny.module("vision")
    patches = (3 * 4 * 4) * 64 + 64 + 16 * 64  # Linear(3*4*4, 64) + position table
    assert vision.params == 4 * block_params(64, 256) + patches
    (group,) = tiny.sharing_groups
    assert group.module == "lm" and group.metaops == ("caption/lm", "transcribe/lm")
    assert group.param_bytes == lm.params * 4


def test_graph_records_its_spec_and_cluster(tiny):
    text = (h.EXAMPLES / "tiny_mm.spindle").read_text()
    assert tiny.spec_sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert tiny.spec_path.endswith("tiny_mm.spindle")
    assert (tiny.cluster.devices, tiny.cluster.devices_per_node, tiny.cluster.device.name) == (
        4,
        4,
        "cpu",
    )
    assert tiny.mix == "default"
    assert [m.name for m in tiny.modalities] == ["image", "audio", "text"]


def test_qwen_shapes():
    g = compile_file(h.EXAMPLES / "qwen_val.spindle").graph
    assert g.dtype_bytes == 2
    assert g.op("image_chat/vision_adapter").out_tokens == 256
    assert g.op("audio_chat/audio_adapter").out_tokens == 750
    assert [
        g.op(f"{t}/llm").tokens for t in ("image_chat", "audio_chat", "av_chat", "text_chat")
    ] == [
        256 + 512,
        750 + 256,
        256 + 750 + 256,
        2048,
    ]
    assert g.op("text_chat/llm").level == 0 and g.op("av_chat/llm").level == 2
    assert sum(t.batch for t in g.tasks) == 1024
    heavy = compile_file(h.EXAMPLES / "qwen_val.spindle", mix="audio_heavy").graph
    assert [t.batch for t in heavy.tasks] == [
        103,
        614,
        102,
        205,
    ]  # remainders .4 tie: first listed wins


FROZEN = """\
modality image { tokens = 4 }
modality text  { tokens = 4; vocab = 50 }
encoder vision : vit(layers = 2, hidden = 16, heads = 2, patch = 2) <- image frozen
module  proj   : mlp(in = 16, out = 32) FROZEN_PROJ
module lm : transformer(layers = 2, hidden = 32, heads = 2, causal = true, vocab = 50) FRZ_LM
task t { image -> vision -> proj -> lm; text -> lm; batch = 2 }
"""


@pytest.mark.parametrize(
    ("proj", "lm", "expected"),
    [
        ("", "", (False, True, True)),  # a frozen source needs no backward
        ("frozen", "", (False, False, True)),
        ("frozen", "frozen", (False, False, False)),
    ],
)
def test_backward_only_where_something_before_trains(proj, lm, expected):
    g = compile_text(FROZEN.replace("FROZEN_PROJ", proj).replace("FRZ_LM", lm)).graph
    assert tuple(g.op(f"t/{m}").needs_backward for m in ("vision", "proj", "lm")) == expected
    assert g.op("t/vision").frozen


def test_frozen_module_after_a_trained_one_still_runs_backward():
    text = FROZEN.replace("<- image frozen", "<- image").replace("FROZEN_PROJ", "frozen")
    g = compile_text(text.replace("FRZ_LM", "")).graph
    proj = g.op("t/proj")
    assert proj.frozen and proj.needs_backward


CHAIN = """\
modality text { tokens = 8; vocab = 100 }
module a : transformer(layers = 2, hidden = 32, heads = 2, vocab = 100)
module b : transformer(layers = 3, hidden = 32, heads = 2B_EXTRA)
module c : transformer(layers = 4, hidden = 32, heads = 2)
module d : transformer(layers = 1, hidden = 32, heads = 2, causal = true, vocab = 100)
task t { text -> a -> b -> c -> d; text -> d; batch = 4 }
"""


def test_identical_chains_contract():
    g = compile_text(CHAIN.replace("B_EXTRA", "")).graph
    assert [m.id for m in g] == ["t/a", "t/b+c", "t/d"]
    bc = g.op("t/b+c")
    assert (bc.segments, bc.layers, bc.module, bc.level) == ((("b", 3), ("c", 4)), 7, "b+c", 1)
    assert bc.forward_flops_per_layer == pytest.approx(block_flops(8, 32, 128) * 4)
    assert g.op("t/d").inputs[0] == OpInput("t/b+c", False, 8)
    assert g.task("t").sinks == ("t/d",)


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (("B_EXTRA", ", ffn = 64"), "different arguments"),
        (("B_EXTRA", ", out_tokens = 4"), "different token counts"),
        (("heads = 2)\nmodule d", "heads = 2) frozen\nmodule d"), "different frozen flags"),
        (
            ("batch = 4 }", "batch = 4 }\ntask u { text -> a -> c -> d; text -> d; batch = 1 }"),
            "c in two tasks",
        ),
        (("-> d; text -> d", "-> d; text -> d; b -> d"), "b feeds two modules"),
    ],
)
def test_chains_that_break_the_rule_stay_apart(edit, why):
    text = CHAIN.replace(*edit).replace("B_EXTRA", "")
    g = compile_text(text).graph
    assert "t/b" in {m.id for m in g} and "t/c" in {m.id for m in g}, why


def test_two_equal_sinks_default_to_contrastive():
    text = (
        "modality a { tokens = 3; features = 4 }\nmodality b { tokens = 5; features = 4 }\n"
        "module x : mlp(in = 4, out = 8)\nmodule y : mlp(in = 4, out = 8)\n"
        "task pair { a -> x; b -> y; batch = 2 }\n"
    )
    task = compile_text(text).graph.task("pair")
    assert task.loss == "contrastive" and task.sinks == ("pair/x", "pair/y")
