"""The memory meter in one process: what it counts, that every term comes back down after a
step (nothing leaks into the next), and that the peak is the sum of its terms."""

from __future__ import annotations

import handgraph as h
import pytest
import torch

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch.memory import TERMS, WATCHED_STEPS, MemoryMeter
from spindle_dsl.backends.torch.params import PartStore
from spindle_dsl.backends.torch.parts import Part
from spindle_dsl.backends.torch.trace import Tracer
from spindle_dsl.backends.torch.trainer import Trainer


def _trainer(graph, **changes):
    config = RunConfig(dtype="float64", progress=False, **changes)
    return Trainer(
        graph, h.sequential_plan(graph), config, {}, 0, 1, torch.device("cpu"), Tracer(0, False),
        lambda _what: None,
    )  # fmt: skip


def test_the_peak_counts_parameters_optimizer_state_and_kept_activations(one_rank):
    graph = h.tiny_mm(1)
    trainer = _trainer(graph)
    meter = trainer.meter
    params = sum(t.numel() * 8 for t in trainer.store.parameters())
    assert meter.live["parameters"] == params and meter.peak == params
    for step in range(2):
        trainer.step(step)
        # after a step only parameters, AdamW state and the exchange's receive buffers remain
        assert meter.live["activations"] == meter.live["gradients"] == 0, meter.live
    terms = meter.peak_terms()
    assert set(terms) == set(TERMS) and sum(terms.values()) == meter.peak_bytes()
    # the second step's forward holds the state the first step allocated: the peak is there
    assert terms["optimizer"] == trainer.opt.state_bytes() == 2 * params  # nothing frozen
    assert terms["parameters"] == params
    assert terms["activations"] > params  # tiny_mm's activations dwarf its weights


def test_gradients_count_until_freed_and_saved_tensors_until_backward():
    graph = h.tiny_mm(1)
    part = Part("lm", "layer.0")
    store = PartStore(graph, [part], seed=0, dtype=torch.float64)
    meter = MemoryMeter(store, torch.device("cpu"))
    layer = store[part]
    x = torch.randn(2, 5, 96, dtype=torch.float64, requires_grad=True)
    with meter.saving():
        y = layer(x)
    saved = meter.live["activations"]
    assert saved > 0  # the layer's saved activations (its weights count as parameters)
    meter.keep(y, "activations")
    assert meter.live["activations"] > saved  # the output, kept as the executor keeps it
    y.sum().backward()
    del y
    assert meter.live["activations"] == 0
    grads = sum(t.grad.numel() * 8 for t in layer.parameters())
    assert meter.live["gradients"] == grads
    for t in layer.parameters():
        t.grad = None
    assert meter.live["gradients"] == 0
    assert meter.peak_terms()["gradients"] <= grads


def test_the_meter_stops_after_its_watched_steps_and_keeps_their_peak(one_rank):
    graph = h.tiny_mm(1)
    trainer = _trainer(graph)
    meter = trainer.meter
    for step in range(WATCHED_STEPS):
        assert meter.watching
        trainer.step(step)
    peak, terms = meter.peak_bytes(), meter.peak_terms()
    assert not meter.watching
    acquired = []
    meter._acquire = lambda *a: acquired.append(a)  # nothing may be counted from here on
    for step in range(WATCHED_STEPS, WATCHED_STEPS + 2):
        trainer.step(step)
    assert acquired == [] and meter.peak_bytes() == peak and meter.peak_terms() == terms
    # a fresh run watched all along reaches the same peak: the later steps add nothing
    again = _trainer(graph)
    again.meter.stop = lambda: None  # watch every step
    for step in range(WATCHED_STEPS + 2):
        again.step(step)
    assert again.meter.watching and again.meter.peak_bytes() == peak


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_peak_is_the_allocators():
    graph = h.tiny_mm(1)
    part = Part("lm", "layer.0")
    device = torch.device("cuda", 0)
    store = PartStore(graph, [part], seed=0, dtype=torch.float32, device=device)
    meter = MemoryMeter(store, device)
    params = sum(t.numel() * 4 for t in store.parameters())
    x = torch.randn(8, 12, 96, device=device, requires_grad=True)
    with meter.saving():
        store[part](x).sum().backward()
    assert meter.peak_bytes() >= params + x.numel() * 4
    assert meter.peak_terms() == {}  # the allocator knows only the total
