"""Binding real datasets to tasks: the workers read them, the mix sets how many samples each
task takes per step, and the result matches the oracle reading the same data."""

from __future__ import annotations

import handgraph as h
import pytest
import torch
from handgraph import lower
from runtime_helpers import loss_errors

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import DictDataset, ReferenceModel, TorchBackend
from spindle_dsl.metagraph import ModalityInfo


def _datasets(n: int = 11) -> dict[str, DictDataset]:
    g = torch.Generator().manual_seed(7)
    return {
        "caption": DictDataset(
            image=torch.rand(n, 16, 48, generator=g),
            text=torch.randint(512, (n, 12), generator=g),
        ),
        "transcribe": DictDataset(
            audio=torch.randn(n, 24, 20, generator=g),
            text=torch.randint(512, (n, 12), generator=g),
        ),
    }


@pytest.mark.slow
def test_bound_datasets_reach_the_workers_and_match_the_oracle():
    graph = h.tiny_mm(2)
    data = _datasets()
    plan = h.make_plan(
        graph,
        [
            [("caption/vision", 0, 4, (0,)), ("transcribe/hearing", 0, 2, (1,))],
            [("caption/vision_proj", 0, 1, (1,)), ("transcribe/audio_proj", 0, 1, (0,))],
            [("caption/lm", 0, 6, (0, 1))],
            [("transcribe/lm", 0, 6, (1, 0))],
        ],
    )
    ref = ReferenceModel(graph, dtype="float64", datasets=data)
    history = ref.train(3)
    config = RunConfig(steps=3, dtype="float64", progress=False)
    result = TorchBackend().train(graph, plan, config, nproc=2, datasets=data)
    assert loss_errors(history, result.steps) < 1e-12
    synthetic = ReferenceModel(graph, dtype="float64").train(1)[0]
    assert synthetic["caption"] != pytest.approx(history[0]["caption"], rel=1e-6)


def test_a_single_rank_runs_in_process_with_a_dataset_and_a_long_text_edge():
    # text[14] is longer than the modality's 12 tokens: the input stage is sized for it
    graph = lower(
        {"enc": ("transformer", dict(layers=2, hidden=16, heads=2, causal=True, vocab=50), False)},
        [ModalityInfo("text", 12, vocab=50)],
        {"lm": ([("text", "enc", 14)], 4, "lm")},
        devices=1,
    )
    ids = torch.arange(5 * 14).reshape(5, 14) % 50
    data = {"lm": DictDataset(text=ids)}
    result = TorchBackend().train(
        graph, h.sequential_plan(graph), RunConfig(steps=2, progress=False), datasets=data
    )
    history = ReferenceModel(graph, datasets=data).train(2)
    assert result.world_size == 1 and result.backend == "gloo"
    assert loss_errors(history, result.steps) < 1e-6
