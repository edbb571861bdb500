"""Gradient buckets issued inside a stage's backward, from autograd's accumulation hooks, as
DDP issues its buckets: the reduction of a stage's later layers starts while its earlier
layers still run backward, and the model trained stays the oracle's (float64)."""

from __future__ import annotations

import json

import handgraph as h
import pytest
from runtime_helpers import loss_errors

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import ReferenceModel, TorchBackend

pytestmark = pytest.mark.slow


def _inside(span: dict, outer: dict) -> bool:
    return outer["ts"] <= span["ts"] and span["ts"] + span["dur"] <= outer["ts"] + outer["dur"]


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_buckets_of_a_stage_are_issued_during_its_backward_and_train_exactly(tmp_path, stage):
    graph = h.tiny_mm(2)
    plan = h.sequential_plan(graph)  # every part on both ranks, every stage several layers
    trace = tmp_path / "trace.json"
    config = RunConfig(
        steps=2,
        dtype="float64",
        progress=False,
        trace=str(trace),
        bucket_elements=20_000,  # about a layer per bucket
        zero_stage=stage,
        optimizer_sharding=stage > 0,
        micro_batches=2,  # stage 2 reduces in both passes, stages 0 and 1 in the last
    )
    result = TorchBackend().train(graph, plan, config, nproc=2)
    assert loss_errors(ReferenceModel(graph, dtype="float64").train(2), result.steps) < 1e-9
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    for rank in (0, 1):
        mine = [e for e in spans if e["tid"] == rank]
        backward = [e for e in mine if e["cat"] == "backward"]
        issued = [e for e in mine if e["name"] == "issue gradients"]
        # some stage issues a bucket and then runs backward on: not only at its very end
        early = [
            (b, i)
            for b in backward
            for i in issued
            if _inside(i, b) and b["ts"] + b["dur"] - (i["ts"] + i["dur"]) > 0.1 * b["dur"]
        ]
        assert early, f"rank {rank}: no bucket issued before its stage's backward ended"
