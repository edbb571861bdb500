"""The runtime against the oracle on hand-lowered graphs and hand-made plans.

These plans are chosen to stress the exchange: groups of 1 to 4 devices handing a MetaOp's
activations to a group of another size between its waves, splits and gathers across levels,
a task batch (3) smaller than its device group (empty shards), contrastive gathers onto one
device, a frozen encoder, a resampler, and a shared text encoder. Float64 makes the comparison
independent of summation order (see test_tiny_mm.py for why float32 cannot be compared at 1e-5
parameter by parameter).
"""

from __future__ import annotations

import itertools
import random

import handgraph as h
import pytest
from runtime_helpers import checkpoint_state, loss_errors, worst_relative
from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import ReferenceModel, TorchBackend

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("graph_fn", "waves", "steps"),
    [(h.tiny_mm, h.TINY_WAVES, 3), (h.clip_like, h.CLIP_WAVES, 4)],
    ids=["tiny_mm", "clip_like"],
)
def test_hand_plan_matches_oracle(tmp_path, graph_fn, waves, steps):
    graph = graph_fn(4)
    plan = h.make_plan(graph, waves)
    ref = ReferenceModel(graph, dtype="float64")
    history = ref.train(steps)
    config = RunConfig(steps=steps, dtype="float64", checkpoint_dir=str(tmp_path), progress=False)
    # the same processes also step a fresh model under the sequential plan (the benchmark's
    # side-by-side mode); it must train the same model, untouched by the first
    compare = (h.sequential_plan(graph),)
    result = TorchBackend().train(graph, plan, config, nproc=4, compare=compare)
    assert [s.step for s in result.steps] == list(range(1, steps + 1))
    assert loss_errors(history, result.steps) < 1e-12
    assert loss_errors(history, result.extra["compared"][0]) < 1e-12
    worst, where = worst_relative(ref.state(), checkpoint_state(tmp_path))
    assert worst < 1e-9, where
    # the oracle moved: a broken optimizer step would not be caught otherwise
    fresh = ReferenceModel(graph, dtype="float64").state()
    assert worst_relative(fresh, checkpoint_state(tmp_path))[0] > 1e-4


def _random_plan(graph, rng: random.Random, n: int):
    """Each MetaOp cut into up to three layer ranges, each on a random device group (any size,
    any order), one entry per wave: every kind of split, gather and empty shard turns up."""
    waves = []
    for op in graph.metaops:
        k = min(op.layers - 1, rng.randint(0, 2))
        bounds = [0, *sorted(rng.sample(range(1, op.layers), k)), op.layers]
        for a, b in itertools.pairwise(bounds):
            waves.append([(op.id, a, b, tuple(rng.sample(range(n), rng.randint(1, n))))])
    return h.make_plan(graph, waves)


def test_random_plans_match_oracle():
    graph = h.clip_like(4)
    rng = random.Random(2024)
    plans = [_random_plan(graph, rng, 4) for _ in range(3)]
    history = ReferenceModel(graph, dtype="float64").train(2)
    config = RunConfig(steps=2, dtype="float64", progress=False)
    result = TorchBackend().train(graph, plans[0], config, nproc=4, compare=tuple(plans[1:]))
    for run in (result.steps, *result.extra["compared"]):
        assert loss_errors(history, run) < 1e-12
