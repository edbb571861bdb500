"""Weights from Hugging Face folders: each part reads only its own tensors, from one file or
from the shards an index lists; what is missing or mis-shaped is listed before anything trains;
``from "DIR"`` on a module declared with its own arguments loads what ``hf("DIR")`` loads."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="transformers is in the dev extra")

import safetensors
import torch
from safetensors.torch import load_file, save_file
from tiny_models import save

from spindle_dsl.backends.torch.params import build_part
from spindle_dsl.backends.torch.parts import Part, graph_parts
from spindle_dsl.backends.torch.weights import check_weights
from spindle_dsl.errors import ExecutionError
from spindle_dsl.language import compile_text

TASK = "modality text { tokens = 16; vocab = 64 }\ntask t { text -> lm; loss = lm; batch = 2 }\n"
DECLARED = (
    "module lm : transformer(layers = 2, hidden = 32, heads = 4, kv_heads = 2, ffn = 48, "
    'causal = true, vocab = 64, act = "swiglu", norm = "rmsnorm", norm_eps = 1e-5, '
    'pos = "rotary", bias = false) from "llama"\n'
)


def graph_of(tmp_path, module: str):
    return compile_text(module + TASK, str(tmp_path / "job.spindle")).graph


def tensors(graph) -> dict[str, torch.Tensor]:
    return {
        f"{p.key}.{n}": t.detach()
        for p in graph_parts(graph)
        for n, t in build_part(graph, p, seed=0).named_parameters()
    }


def test_a_part_reads_only_its_own_tensors(tmp_path, monkeypatch) -> None:
    save("llama", tmp_path / "llama")
    graph = graph_of(tmp_path, 'module lm : hf("llama")\n')
    read: list[str] = []
    real = safetensors.safe_open

    class Recording:
        def __init__(self, *args, **kwargs):
            self.inner = real(*args, **kwargs)

        def __enter__(self):
            self.handle = self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def get_tensor(self, key):
            read.append(key)
            return self.handle.get_tensor(key)

        def __getattr__(self, name):  # keys, get_slice: the header, which costs no tensor
            return getattr(self.handle, name)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    build_part(graph, Part("lm", "layer.1"), seed=0)
    assert read and all(k.startswith("model.layers.1.") for k in read)
    assert len(read) == 9  # two norms, q, k, v, o, gate, up, down


def test_sharded_folders_load_as_one_file_does(tmp_path) -> None:
    model = save("llama", tmp_path / "llama")
    model.save_pretrained(tmp_path / "shards", max_shard_size="20KB")
    assert (tmp_path / "shards" / "model.safetensors.index.json").exists()
    one = tensors(graph_of(tmp_path, 'module lm : hf("llama")\n'))
    many = tensors(graph_of(tmp_path, 'module lm : hf("shards")\n'))
    assert one.keys() == many.keys() and all(torch.equal(one[k], many[k]) for k in one)
    embed = model.model.embed_tokens.weight
    assert torch.equal(one["lm/input.text.embed.weight"], embed.detach())


def test_missing_and_misshaped_tensors_are_listed_before_training(tmp_path) -> None:
    save("llama", tmp_path / "llama")
    path = tmp_path / "llama" / "model.safetensors"
    state = load_file(path)
    del state["model.layers.0.mlp.up_proj.weight"]
    state["model.norm.weight"] = torch.ones(31)
    save_file(state, path, metadata={"format": "pt"})
    graph = graph_of(tmp_path, 'module lm : hf("llama")\n')
    with pytest.raises(ExecutionError) as exc:
        check_weights(graph, graph_parts(graph))
    message = str(exc.value)
    assert "missing 1 tensor(s): model.layers.0.mlp.up_proj.weight" in message
    assert "model.norm.weight: the file has [31], the model [32]" in message


def test_from_a_folder_loads_what_hf_loads(tmp_path) -> None:
    save("llama", tmp_path / "llama")
    by_hf = tensors(graph_of(tmp_path, 'module lm : hf("llama")\n'))
    by_from = tensors(graph_of(tmp_path, DECLARED))
    assert by_hf.keys() == by_from.keys()
    assert all(torch.equal(by_hf[k], by_from[k]) for k in by_hf)
