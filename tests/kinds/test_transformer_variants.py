"""The transformer/vit block variants (SwiGLU, RMSNorm, GQA, biases, rotary, tied embeddings):
each pinned three ways as the default block is (the kind's formula, a closed form written out
here, the PyTorch layer), plus the numerics that a count cannot see (rotary positions are
relative, GQA matches torch's own grouped attention, RMSNorm matches torch's)."""

from __future__ import annotations

import pytest
import torch
from specfixtures import SPEC_DIR
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from spindle_dsl.kinds import get_kind
from spindle_dsl.kinds.layers import RMSNorm, attention, rotate
from spindle_dsl.language import compile_text
from spindle_dsl.metagraph import ModalityInfo

VARIANTS = [
    {"act": "swiglu"},
    {"norm": "rmsnorm"},
    {"kv_heads": 2},
    {"kv_heads": 1, "bias": False},
    {"bias": False, "qkv_bias": True},
    {"pos": "rotary"},
    {
        "act": "swiglu",
        "norm": "rmsnorm",
        "kv_heads": 2,
        "bias": False,
        "qkv_bias": True,
        "pos": "rotary",
        "causal": True,
    },
]
BASE = {"layers": 2, "hidden": 48, "heads": 4, "ffn": 40}


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def closed_form_params(a: dict) -> int:
    """One block written out term by term, independently of ``common.BlockShape``."""
    h, f, heads, kv = a["hidden"], a["ffn"], a["heads"], a["kv_heads"]
    d = h // heads
    norms = 2 * (2 * h if a["norm"] == "layernorm" else h)
    q = h * h + (h if a["qkv_bias"] else 0)
    k = v = h * kv * d + (kv * d if a["qkv_bias"] else 0)
    o = h * h + (h if a["bias"] else 0)
    if a["act"] == "swiglu":
        mlp = 3 * h * f + ((2 * f + h) if a["bias"] else 0)
    else:
        mlp = 2 * h * f + ((f + h) if a["bias"] else 0)
    return norms + q + k + v + o + mlp


def closed_form_flops(a: dict, t: int) -> float:
    h, f, kv, d = a["hidden"], a["ffn"], a["kv_heads"], a["hidden"] // a["heads"]
    qkv = 2 * t * h * (h + 2 * kv * d)
    attn = 4 * t * t * h
    mlp = (6 if a["act"] == "swiglu" else 4) * t * h * f
    return qkv + attn + 2 * t * h * h + mlp


def closed_form_activations(a: dict, t: int) -> float:
    """What autograd keeps, tensor by tensor (tests/kinds/test_saved_activations.py measures
    the layer itself)."""
    h, f, heads, kv = a["hidden"], a["ffn"], a["heads"], a["kv_heads"]
    d = h // heads
    gqa, rotary = kv != heads, a.get("pos") == "rotary"
    layernorm = a["norm"] == "layernorm"
    x, norm1_out, norm2_in, norm2_out = t * h, t * h, t * h, t * h
    norm_kept = 2 * (2 * t if layernorm else t + t * h)  # mean and 1/std, or 1/rms and x/rms
    qkv_out = 0 if (gqa and rotary) else t * (h + 2 * kv * d)
    q_rotated = t * h if rotary else 0
    k_rotated = t * kv * d if rotary and not gqa else 0
    kv_repeated = 2 * t * h if gqa else 0
    attention_out, log_sum_exp = t * h, heads * t
    heads_merged = t * h if rotary else 0  # a copy when attention's output is per head
    ffn_kept = (4 if a["act"] == "swiglu" else 2) * t * f
    return (
        x
        + norm1_out
        + norm2_in
        + norm2_out
        + norm_kept
        + qkv_out
        + q_rotated
        + k_rotated
        + kv_repeated
        + attention_out
        + log_sum_exp
        + heads_merged
        + ffn_kept
    )


def test_defaults_are_the_gpt2_block() -> None:
    kind = get_kind("transformer")
    args = kind.resolve({"layers": 1, "hidden": 32, "heads": 4})
    assert (args["act"], args["norm"], args["pos"]) == ("gelu", "layernorm", "learned")
    assert (args["kv_heads"], args["bias"], args["qkv_bias"], args["tie_embeddings"]) == (
        4,
        True,
        True,
        False,
    )
    h, f = 32, 128
    assert kind.layer_params(args) == 4 * h * h + 2 * h * f + 9 * h + f
    # qkv_bias follows bias unless given
    assert kind.resolve({**BASE, "bias": False})["qkv_bias"] is False
    assert kind.resolve({**BASE, "bias": False, "qkv_bias": True})["qkv_bias"] is True


@pytest.mark.parametrize("name", ["transformer", "vit"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_params_flops_activations_agree(name: str, variant: dict) -> None:
    kind = get_kind(name)
    given = {**BASE, **variant}
    if name == "vit":
        if "pos" in given or "causal" in given:
            given = {k: v for k, v in given.items() if k not in ("pos", "causal")}
        given["patch"] = 2
    assert kind.check_args(given) == []
    args = kind.resolve(given)
    layer = kind.build_layer(args)
    assert kind.layer_params(args) == closed_form_params(args) == numel(layer)
    for t in (1, 6):
        expected = closed_form_flops(args, t)
        assert kind.forward_flops(args, t) == pytest.approx(expected, rel=1e-12)
        assert kind.activation_elements(args, t) == closed_form_activations(args, t)
        x = torch.randn(2, t, 48)
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            out = layer(x)
        assert counter.get_total_flops() == pytest.approx(2 * expected, rel=1e-12)
        assert out.shape == (2, t, 48)


def test_rotary_has_no_position_table_and_learned_has_one() -> None:
    kind = get_kind("transformer")
    text = ModalityInfo("text", tokens=12, vocab=50)
    audio = ModalityInfo("audio", tokens=24, features=20)
    for pos, table in (("learned", 1), ("rotary", 0)):
        args = kind.resolve({**BASE, "pos": pos, "bias": False})
        assert kind.input_stage_params(args, text) == 50 * 48 + table * 12 * 48
        assert kind.input_stage_params(args, audio) == 20 * 48 + table * 24 * 48  # no bias
        for m in (text, audio):
            assert numel(kind.build_input_stage(args, m)) == kind.input_stage_params(args, m)


def test_rotary_scores_depend_only_on_relative_position() -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 10, 8)
    k = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 10, 8)
    scores = rotate(q, 10000.0) @ rotate(k, 10000.0).transpose(-1, -2)
    # the same q and k at every position: the score is a function of i - j alone
    for shift in range(-3, 4):
        diag = torch.diagonal(scores[0, 0], offset=shift)
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-12)
    assert not torch.allclose(torch.diagonal(scores[0, 0], 0)[0], scores[0, 0, 0, 1])
    # position 0 is not rotated
    assert torch.equal(rotate(q, 10000.0)[..., 0, :], q[..., 0, :])


def test_grouped_query_attention_matches_torch() -> None:
    torch.manual_seed(1)
    q = torch.randn(2, 6, 5, 4, dtype=torch.float64)
    k = torch.randn(2, 2, 5, 4, dtype=torch.float64)
    v = torch.randn(2, 2, 5, 4, dtype=torch.float64)
    for causal in (False, True):
        want = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=True
        )
        assert torch.allclose(attention(q, k, v, causal), want, atol=1e-12)


def test_rmsnorm_and_swiglu_compute_what_they_say() -> None:
    torch.manual_seed(2)
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    ours = RMSNorm(16).double()
    with torch.no_grad():
        ours.weight.copy_(torch.randn(16))
    ref = torch.nn.RMSNorm(16, eps=1e-6).double()
    with torch.no_grad():
        ref.weight.copy_(ours.weight)
    assert torch.allclose(ours(x), ref(x), atol=1e-12)

    kind = get_kind("transformer")
    layer = kind.build_layer(kind.resolve({"layers": 1, "hidden": 16, "heads": 2, "ffn": 24,
                                           "act": "swiglu", "bias": False})).double()  # fmt: skip
    gate, up = layer.ffn.fc1.weight[:24], layer.ffn.fc1.weight[24:]
    want = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ layer.ffn.fc2.weight.T
    assert torch.allclose(layer.ffn(x), want, atol=1e-12)


def test_tied_head_has_only_its_norm_and_uses_the_embedding() -> None:
    kind = get_kind("transformer")
    args = kind.resolve({**BASE, "causal": True, "vocab": 50, "tie_embeddings": True})
    assert kind.head_params(args) == 2 * 48
    head = kind.build_head(args)
    assert numel(head) == 2 * 48
    stage = kind.build_input_stage(args, ModalityInfo("text", tokens=12, vocab=50))
    head.tie_to(stage)
    x = torch.randn(2, 3, 48)
    assert torch.allclose(head(x), head.ln(x) @ stage.embed.weight.T)
    # a tied embedding starts at std 1/sqrt(hidden), so the first logits are near unit scale
    torch.manual_seed(0)
    big = kind.resolve(
        {**BASE, "hidden": 256, "causal": True, "vocab": 400, "tie_embeddings": True}
    )
    std = float(
        kind.build_input_stage(big, ModalityInfo("t", 4, vocab=400)).embed.weight.detach().std()
    )
    assert std == pytest.approx(256**-0.5, rel=0.05)
    untied = kind.resolve({**BASE, "causal": True, "vocab": 50, "norm": "rmsnorm"})
    assert kind.head_params(untied) == 48 + 48 * 50 == numel(kind.build_head(untied))


@pytest.mark.parametrize(
    ("name", "given", "words"),
    [
        ("transformer", {**BASE, "act": "relu"}, ["'act'", '"gelu" or "swiglu"']),
        ("transformer", {**BASE, "norm": "batchnorm"}, ["'norm'", "rmsnorm"]),
        ("transformer", {**BASE, "pos": "alibi"}, ["'pos'", "rotary"]),
        ("transformer", {**BASE, "kv_heads": 3}, ["kv_heads = 3", "divisible"]),
        ("transformer", {**BASE, "tie_embeddings": True}, ["tie_embeddings", "causal"]),
        ("transformer", {**BASE, "hidden": 36, "heads": 4, "pos": "rotary"}, ["even"]),
        ("transformer", {**BASE, "bias": 1}, ["'bias'", "bool"]),
        ("vit", {**BASE, "patch": 2, "pos": "rotary"}, ["takes no argument 'pos'"]),
        ("vit", {**BASE, "patch": 2, "tie_embeddings": True}, ["no argument 'tie_embeddings'"]),
    ],
)
def test_bad_variants_are_named(name: str, given: dict, words: list[str]) -> None:
    problems = get_kind(name).check_args(given)
    text = " ".join(message for _, message in problems)
    assert problems and all(w in text for w in words), text


QWEN2_7B = """
cluster { devices = 8; device = "A100-80GB" }
modality text { tokens = 4096; vocab = 152064 }
module llm : transformer(layers = 28, hidden = 3584, heads = 28, kv_heads = 4, ffn = 18944,
                         act = "swiglu", norm = "rmsnorm", bias = false, qkv_bias = true,
                         pos = "rotary", causal = true, vocab = 152064)
task pretrain { text -> llm; loss = lm; batch = 64 }
"""
LLAMA2_7B = SPEC_DIR / "next" / "llama2_7b.spindle"


def _meta_count(graph) -> int:
    """Every part of the one module built on the meta device (no memory): one layer times the
    layer count, plus its input stage and head."""
    module = graph.modules[0]
    kind, args = get_kind(module.kind), dict(module.args)
    with torch.device("meta"):
        layer = kind.build_layer(args)
        stage = kind.build_input_stage(args, graph.stage_modality(module.name, "text"))
        head = kind.build_head(args)
    return module.layers * numel(layer) + numel(stage) + numel(head)


def test_qwen2_7b_shape_counts_exactly() -> None:
    graph = compile_text(QWEN2_7B).graph
    assert graph.modules[0].params == 7_615_616_512
    assert _meta_count(graph) == 7_615_616_512


def test_llama2_7b_counts_exactly() -> None:
    graph = compile_text(LLAMA2_7B.read_text(), str(LLAMA2_7B)).graph
    assert graph.modules[0].params == 6_738_415_616
    assert _meta_count(graph) == 6_738_415_616


def test_spindle_check_json_totals(capsys) -> None:
    import json

    from spindle_dsl.cli import main

    assert main(["check", str(LLAMA2_7B), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["params"] == 6_738_415_616
