"""Activation recompute, in one process: the layers of a recomputing MetaOp really run their
forward again in backward, keep less alive between forward and backward, and change nothing in
the numbers (the multi-process runs against the oracle are in test_exact_hand.py)."""

from __future__ import annotations

import dataclasses

import handgraph as h
import torch

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch.parts import Part
from spindle_dsl.backends.torch.trace import Tracer
from spindle_dsl.backends.torch.trainer import Trainer, recompute_set


def _plan_marking(graph, *ids):
    plan = h.sequential_plan(graph)
    metaops = tuple(dataclasses.replace(m, recompute=m.id in ids) for m in plan.metaops)
    return dataclasses.replace(plan, metaops=metaops)


def _trainer(graph, plan, mode):
    config = RunConfig(dtype="float64", recompute=mode, progress=False)
    return Trainer(graph, plan, config, {}, 0, 1, torch.device("cpu"), Tracer(0, False), _quiet)


def _quiet(_what: str) -> None:
    pass


def _counter(calls: dict[str, int], what: str):
    def hook(*_args) -> None:
        calls[what] += 1

    return hook


def test_recompute_follows_the_plan_unless_forced():
    graph = h.tiny_mm(1)
    plan = _plan_marking(graph, "caption/lm")
    assert recompute_set(plan, "plan") == {"caption/lm"}
    assert recompute_set(plan, "none") == frozenset()
    assert recompute_set(plan, "all") == {m.id for m in graph.metaops}


def test_recomputed_layers_run_twice_and_train_exactly_the_same(one_rank):
    graph = h.tiny_mm(1)
    plan = _plan_marking(graph, "caption/lm")  # lm's layers serve caption and transcribe
    runs = {}
    for mode in ("none", "plan", "all"):
        trainer = _trainer(graph, plan, mode)
        calls = {"layer": 0, "input": 0}
        for what, part in (("layer", "layer.2"), ("input", "input.text")):
            trainer.store[Part("lm", part)].register_forward_pre_hook(_counter(calls, what))
        records = [trainer.step(s) for s in range(2)]
        state = {p: [t.detach().clone() for t in trainer.store[p].parameters()] for p in
                 trainer.store.parts}  # fmt: skip
        runs[mode] = ([r.losses for r in records], state, dict(calls))
    # per step: caption and transcribe each run lm once; recompute adds a forward in backward
    assert runs["none"][2] == {"layer": 4, "input": 4}
    assert runs["plan"][2] == {"layer": 6, "input": 4}  # only caption/lm recomputes
    assert runs["all"][2] == {"layer": 8, "input": 4}  # input stages never do
    for mode in ("plan", "all"):
        assert runs[mode][0] == runs["none"][0]  # losses, bit for bit
        for part, tensors in runs["none"][1].items():
            assert all(torch.equal(a, b) for a, b in zip(tensors, runs[mode][1][part], strict=True))


def test_recompute_keeps_less_alive_between_forward_and_backward(one_rank):
    graph = h.tiny_mm(1)
    plan = h.sequential_plan(graph)
    kept = {}
    for mode in ("none", "all"):
        trainer = _trainer(graph, plan, mode)
        trainer.executor.run(0)
        # the activations the step held at its peak (the memory meter counts what autograd
        # saves, stage outputs and received activations)
        kept[mode] = trainer.meter.peak_terms()["activations"]
    # tensors that the layers of recomputing MetaOps save go to the checkpoint, not here
    assert 0 < kept["all"] < kept["none"] / 2, kept
