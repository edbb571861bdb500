"""The block and tower options (``kinds/tower.py``) priced exactly as the PyTorch layers are
built: parameters against ``sum(p.numel())``, FLOPs against torch's counter, saved activations
against what autograd keeps, and output shapes against ``out_tokens``, for every option alone
and in the combinations the Hugging Face architectures use."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import ModalityInfo

BLOCK = {"layers": 2, "hidden": 32, "heads": 4, "ffn": 48}
IMAGE = ModalityInfo("image", tokens=9)
AUDIO = ModalityInfo("audio", tokens=11, features=6)
TEXT = ModalityInfo("text", tokens=10, vocab=40)

CASES = [
    ("transformer", {"head_dim": 12}, TEXT),
    ("transformer", {"head_dim": 6, "kv_heads": 2, "pos": "rotary", "causal": True}, TEXT),
    ("transformer", {"act": "quick_gelu"}, TEXT),
    ("transformer", {"act": "gelu_tanh", "norm_eps": 1e-3}, TEXT),
    ("transformer", {"k_bias": False}, TEXT),  # Whisper's q and v biases without k's
    ("transformer", {"bias": False, "qkv_bias": True, "out_bias": True}, TEXT),  # Llama's
    ("transformer", {"mlp_bias": False, "act": "swiglu", "norm": "rmsnorm"}, TEXT),
    ("transformer", {"final_norm": True}, TEXT),
    ("transformer", {"final_norm": True, "norm": "rmsnorm"}, TEXT),
    ("transformer", {"positions": 16}, TEXT),
    (
        "transformer",
        {"pos": "rotary", "rope_scaling": "llama3", "rope_original_max": 4, "causal": True},
        TEXT,
    ),
    ("transformer", {"stem": "conv", "pos": "sinusoidal", "k_bias": False}, AUDIO),
    ("transformer", {"stem": "conv", "positions": 8, "final_norm": True}, AUDIO),
    ("transformer", {"pos": "sinusoidal"}, AUDIO),
    ("vit", {"patch": 2, "cls": True}, IMAGE),
    ("vit", {"patch": 2, "embed_norm": True, "patch_bias": False}, IMAGE),
    ("vit", {"patch": 2, "cls": True, "output": "patches"}, IMAGE),
    ("vit", {"patch": 2, "cls": True, "output": "cls", "final_norm": True}, IMAGE),
    ("vit", {"patch": 2, "cls": True, "pool": "norm", "output": "pooled"}, IMAGE),  # CLIP
    ("vit", {"patch": 2, "cls": True, "pool": "norm", "embed_norm": True}, IMAGE),
    ("vit", {"patch": 2, "cls": True, "final_norm": True, "pool": "dense"}, IMAGE),  # ViT
    (
        "vit",
        {"patch": 2, "cls": True, "final_norm": True, "pool": "dense", "output": "pooled"},
        IMAGE,
    ),
    ("vit", {"patch": 2, "final_norm": True, "pool": "map"}, IMAGE),  # SigLIP
    ("vit", {"patch": 2, "final_norm": True, "pool": "map", "output": "pooled"}, IMAGE),
    ("vit", {"patch": 2, "pool": "map", "output": "pooled", "act": "gelu_tanh"}, IMAGE),
    ("vit", {"patch": 2, "cls": True, "output": "cls", "out_tokens": 1}, IMAGE),
]
IDS = [f"{k}-{'-'.join(f'{a}={v}' for a, v in g.items())}" for k, g, _ in CASES]


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def raw(kind, args, modality: ModalityInfo, batch: int) -> torch.Tensor:
    if modality.vocab is not None:
        return torch.randint(0, modality.vocab, (batch, modality.tokens))
    width = modality.features or 3 * int(args["patch"]) ** 2
    return torch.randn(batch, modality.tokens, width)


def resolved(name: str, given: dict):
    kind = get_kind(name)
    full = {**BLOCK, **given}
    assert kind.check_args(full) == []
    return kind, kind.resolve(full)


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


@pytest.mark.parametrize(("name", "given", "modality"), CASES, ids=IDS)
def test_parameters_are_the_layers(name, given, modality) -> None:
    kind, args = resolved(name, given)
    assert numel(kind.build_layer(args, last=False)) == kind.layer_params(args)
    last = kind.build_layer(args, last=True)
    assert numel(last) == kind.layer_params(args) + kind.tail_params(args)
    assert numel(kind.build_input_stage(args, modality)) == kind.input_stage_params(args, modality)
    head = kind.build_head(args)
    assert (numel(head) if head is not None else 0) == kind.head_params(args)


@pytest.mark.parametrize(("name", "given", "modality"), CASES, ids=IDS)
def test_shapes_follow_layer_and_out_tokens(name, given, modality) -> None:
    kind, args = resolved(name, given)
    x = kind.build_input_stage(args, modality)(raw(kind, args, modality, 2))
    tokens = kind.layer_tokens(args, modality.tokens)
    assert x.shape == (2, tokens, kind.in_width(args))
    assert kind.build_layer(args, last=False)(x).shape == x.shape
    out = kind.build_layer(args, last=True)(x)
    assert out.shape == (2, kind.out_tokens(args, modality.tokens), kind.out_width(args))


@pytest.mark.parametrize(("name", "given", "modality"), CASES, ids=IDS)
def test_flops_are_torch_counter(name, given, modality) -> None:
    kind, args = resolved(name, given)
    batch, t = 3, modality.tokens
    x = torch.randn(batch, kind.layer_tokens(args, t), kind.in_width(args))
    for last, expected in (
        (False, kind.forward_flops(args, t)),
        (True, kind.forward_flops(args, t) + kind.tail_flops(args, t)),
    ):
        layer = kind.build_layer(args, last=last)
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            layer(x)
        assert counter.get_total_flops() == pytest.approx(batch * expected, rel=1e-12)
    own = kind.input_stage_flops(args, modality)
    if own is not None:
        stage = kind.build_input_stage(args, modality)
        with FlopCounterMode(display=False) as counter:
            stage(raw(kind, args, modality, batch))
        assert counter.get_total_flops() == pytest.approx(batch * own, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("name", "given", "modality"), CASES, ids=IDS)
def test_activations_are_what_autograd_saves(name, given, modality, dtype) -> None:
    kind, args = resolved(name, given)
    t = modality.tokens
    fixed = kind.block(args).batch_free_activations(kind.layer_tokens(args, t))
    per_sample = {
        False: kind.activation_elements(args, t),
        True: kind.activation_elements(args, t) + kind.tail_activations(args, t),
    }
    for last, expected in per_sample.items():
        layer = kind.build_layer(args, last=last).to(dtype)
        for batch in (1, 3):
            shape = (batch, kind.layer_tokens(args, t), kind.in_width(args))
            x = torch.randn(*shape, dtype=dtype, requires_grad=True)
            assert saved_elements(layer, x) == batch * expected + fixed, (last, batch)


TOWER_SPEC = """
cluster { devices = 2; device = cpu }
modality image { tokens = 9 }
modality text { tokens = 6; vocab = 40 }
encoder vision : vit(layers = 2, hidden = 32, heads = 4, ffn = 48, patch = 2, final_norm = true,
                     pool = "map", output = "pooled", act = "gelu_tanh") <- image frozen
module proj : mlp(in = 32, out = 24)
module lm : transformer(layers = 2, hidden = 24, heads = 4, causal = true, vocab = 40,
                        act = "swiglu", norm = "rmsnorm", pos = "rotary", head_dim = 8,
                        bias = false, qkv_bias = true, out_bias = true, norm_eps = 1e-5)
task caption { image -> vision -> proj -> lm; text -> lm; loss = lm; batch = 4 }
"""


def test_a_module_counts_what_its_parts_build_and_the_planner_prices_the_tail() -> None:
    from spindle_dsl.backends.torch.params import construct_part
    from spindle_dsl.backends.torch.parts import graph_parts
    from spindle_dsl.cost.memory import op_memory_info
    from spindle_dsl.cost.step_parts import op_steps
    from spindle_dsl.language import compile_text

    graph = compile_text(TOWER_SPEC).graph
    with torch.device("meta"):
        built = {p: numel(construct_part(graph, p)) for p in graph_parts(graph)}
    for m in graph.modules:
        assert sum(n for p, n in built.items() if p.module == m.name) == m.params, m.name
    kind, args = get_kind("vit"), dict(graph.module("vision").args)
    op = graph.op("caption/vision")
    assert op.out_tokens == 1
    # the tail's FLOPs spread over the two layers; its parameters sit with the last layer
    per_layer = kind.forward_flops(args, 9) + kind.tail_flops(args, 9) / 2
    assert op.forward_flops_per_layer == pytest.approx(4 * per_layer, rel=1e-12)
    info = op_memory_info(graph, op)
    assert info.tail is not None and info.tail.replicated == 4 * kind.tail_params(args)
    assert info.tail in info.last_layer_parts(first=1)
    steps = op_steps(graph)["caption/vision"]
    assert steps.layer_parts[-1][1] == 0.0  # frozen: no gradient bytes, the tail's neither
    lm_steps = op_steps(graph)["caption/lm"]
    assert lm_steps.layer_parts[0][1] == lm_steps.layer_parts[1][1]  # no tail: equal layers
