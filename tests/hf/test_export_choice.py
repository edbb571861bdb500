"""Which architecture a module declared with its own arguments exports as: the first whose
config holds the arguments and reads back to exactly them (Llama-shaped -> llama, q/k/v biases
alone -> qwen2), and the project's format, with the reason, where none does."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="transformers is in the dev extra")

import torch
import transformers

from spindle_dsl.backends.torch.export import initial_tensors
from spindle_dsl.backends.torch.params import PartStore
from spindle_dsl.backends.torch.parts import Part, graph_parts
from spindle_dsl.hf.export import export_folders
from spindle_dsl.language import compile_text

LM = (
    "transformer(layers = 2, hidden = 32, heads = 4, kv_heads = 2, ffn = 48, causal = true, "
    'vocab = 64, act = "swiglu", norm = "rmsnorm", pos = "rotary", bias = false{extra})'
)
TASK = "modality text { tokens = 8; vocab = 64 }\ntask t { text -> m; loss = lm; batch = 2 }\n"


def export(tmp_path, kind: str):
    graph = compile_text(f"module m : {kind}\n" + TASK, str(tmp_path / "job.spindle")).graph
    (done,) = export_folders(graph, tmp_path / "out", initial_tensors(graph), module="m")
    return graph, done


@pytest.mark.parametrize(
    ("extra", "model_type", "cls"),
    [
        ("", "llama", transformers.LlamaForCausalLM),
        (", norm_eps = 1e-5, rope_theta = 500000", "llama", transformers.LlamaForCausalLM),
        (", qkv_bias = true", "qwen2", transformers.Qwen2ForCausalLM),
        (", qkv_bias = true, out_bias = true", "llama", transformers.LlamaForCausalLM),
    ],
)
def test_a_declared_module_exports_as_the_architecture_it_is(tmp_path, extra, model_type, cls):
    graph, done = export(tmp_path, LM.format(extra=extra))
    assert done.model_type == model_type, done.note
    model, info = cls.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    store = PartStore(graph, graph_parts(graph), seed=0)
    ids = torch.randint(0, 64, (2, 8))
    x = store[Part("m", "input.text")](ids)
    for j in range(2):
        x = store[Part("m", f"layer.{j}")](x)
    with torch.no_grad():
        assert torch.allclose(store[Part("m", "head")](x), model(ids).logits, atol=1e-5)


def test_a_module_no_architecture_holds_keeps_the_projects_format(tmp_path) -> None:
    _, done = export(tmp_path, LM.format(extra="").replace('pos = "rotary"', 'pos = "learned"'))
    assert done.model_type is None and "llama: it has pos = 'learned', not 'rotary'" in done.note
    assert (tmp_path / "out" / "weights.safetensors").is_file()
