"""The project's forward of a module read from a Hugging Face folder, beside transformers'
forward of the same folder, for one tiny model of each supported architecture."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from spindle_dsl.backends.torch.datafiles import patchify
from spindle_dsl.backends.torch.params import PartStore
from spindle_dsl.backends.torch.parts import Part, graph_parts
from spindle_dsl.language import compile_text


@dataclass(frozen=True)
class Case:
    """One architecture: its tiny model's name (``tiny_models``), the modality and task the
    spec feeds it, and which transformers output the project's output is compared with."""

    name: str
    modality: str
    output: str  # "logits", "last_hidden_state" or "pooler_output"
    extra: str = ""  # more arguments of hf(...)


LMS = ("llama", "llama3", "mistral", "qwen2")
CASES = [
    *(Case(n, "modality text { tokens = 12; vocab = 64 }", "logits") for n in LMS),
    Case("vit", "modality image { tokens = 16 }", "last_hidden_state"),
    Case("vit", "modality image { tokens = 16 }", "pooler_output", ', output = "pooled"'),
    Case("clip_vision", "modality image { tokens = 16 }", "last_hidden_state"),
    Case("clip_vision", "modality image { tokens = 16 }", "pooler_output", ', output = "pooled"'),
    Case("clip_text", "modality text { tokens = 16; vocab = 64 }", "last_hidden_state"),
    Case("siglip_vision", "modality image { tokens = 16 }", "last_hidden_state"),
    Case("siglip_vision", "modality image { tokens = 16 }", "pooler_output", ', output = "pooled"'),
    Case("whisper", "modality audio { tokens = 24; features = 8 }", "last_hidden_state"),
]


def spec(case: Case, folder: Path) -> str:
    source = case.modality.split()[1]
    if case.output == "logits":
        module, loss = f'module m : hf("{folder}")', "lm"
    else:
        module, loss = f'encoder m : hf("{folder}"{case.extra}) <- {source}', "mse"
    return f"{case.modality}\n{module}\ntask t {{ {source} -> m; loss = {loss}; batch = 2 }}\n"


def inputs(case: Case, batch: int = 2) -> tuple[dict, torch.Tensor]:
    """(transformers' keyword inputs, the project's raw rows) of one batch."""
    rng = np.random.default_rng(7)
    if "vocab" in case.modality:
        tokens = 12 if case.output == "logits" else 16
        ids = torch.from_numpy(rng.integers(0, 64, size=(batch, tokens)))
        return {"input_ids": ids}, ids
    if "features" in case.modality:
        frames = torch.from_numpy(rng.standard_normal((batch, 24, 8)).astype(np.float32))
        return {"input_features": frames.transpose(1, 2).contiguous()}, frames
    pixels = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
    return {"pixel_values": torch.from_numpy(pixels)}, torch.from_numpy(patchify(pixels, 4))


def ours(case: Case, folder: Path, raw: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """The project's output of the module ``hf(folder)`` on ``raw``."""
    graph = compile_text(spec(case, folder), str(folder.parent / "job.spindle")).graph
    store = PartStore(graph, graph_parts(graph), seed=0, dtype=dtype)
    info = graph.module("m")
    (modality, _), *_ = info.raw_inputs
    x = store[Part("m", f"input.{modality}")](raw if not raw.is_floating_point() else raw.to(dtype))
    for j in range(info.layers):
        x = store[Part("m", f"layer.{j}")](x)
    if case.output == "logits":
        return store[Part("m", "head")](x)
    return x[:, 0] if case.output == "pooler_output" else x


def theirs(case: Case, model, given: dict) -> torch.Tensor:
    with torch.no_grad():
        if case.name == "whisper":
            return model.encoder(**given).last_hidden_state
        return getattr(model(**given), case.output)


def state(graph) -> dict[str, torch.Tensor]:
    store = PartStore(graph, graph_parts(graph), seed=0)
    return {f"{p.key}.{n}": t.detach() for p in store.parts for n, t in store[p].named_parameters()}
