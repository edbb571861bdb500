"""The runtime against the oracle on hand-lowered graphs and hand-made plans.

These plans are chosen to stress the exchange: groups of 1 to 4 devices handing a MetaOp's
activations to a group of another size between its waves, splits and gathers across levels,
a task batch (3) smaller than its device group (empty shards), contrastive gathers onto one
device, a frozen encoder, a resampler, and a shared text encoder. Float64 makes the comparison
independent of summation order (see test_tiny_mm.py for why float32 cannot be compared at 1e-5
parameter by parameter).

Each job also exercises the memory model's runtime side: the hand plan marks some MetaOps for
activation recompute and runs the sharded optimizer (reduce-scatter on tiny_mm, the all-reduce
fallback on clip_like), while the same processes step the sequential plan with every MetaOp
recomputing and the optimizer unsharded.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import handgraph as h
import pytest
from runtime_helpers import checkpoint_state, loss_errors, worst_relative

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import ReferenceModel, TorchBackend
from spindle_dsl.backends.torch.schedule import build_schedule, shard_bounds

pytestmark = pytest.mark.slow

CASES = {
    "tiny_mm": (h.tiny_mm, h.TINY_WAVES, 3, ("caption/vision", "transcribe/lm"), "auto"),
    "clip_like": (h.clip_like, h.CLIP_WAVES, 4, ("imu_text/text_enc", "regress/res"), "all_reduce"),
}


def _recomputing(plan, ids):
    """``plan`` with activation recompute on the MetaOps ``ids`` (as the planner marks them)."""
    marked = tuple(dataclasses.replace(m, recompute=m.id in ids) for m in plan.metaops)
    return dataclasses.replace(plan, metaops=marked)


@pytest.fixture(scope="module", params=list(CASES))
def hand_run(request, tmp_path_factory):
    graph_fn, waves, steps, recompute, collective = CASES[request.param]
    graph = graph_fn(4)
    plan = _recomputing(h.make_plan(graph, waves), recompute)
    ckpt = tmp_path_factory.mktemp(request.param)
    config = RunConfig(
        steps=steps,
        dtype="float64",
        checkpoint_dir=str(ckpt),
        progress=False,
        grad_collective=collective,
    )
    # the same processes also step a fresh model under the sequential plan (the benchmark's
    # side-by-side mode); it must train the same model, untouched by the first
    compare = ((h.sequential_plan(graph), {"recompute": "all", "optimizer_sharding": False}),)
    result = TorchBackend().train(graph, plan, config, nproc=4, compare=compare)
    ref = ReferenceModel(graph, dtype="float64")
    history = ref.train(steps)
    return graph, plan, steps, result, ckpt, ref, history


def test_hand_plan_matches_oracle(hand_run):
    graph, _, steps, result, ckpt, ref, history = hand_run
    assert [s.step for s in result.steps] == list(range(1, steps + 1))
    assert loss_errors(history, result.steps) < 1e-12
    assert loss_errors(history, result.extra["compared"][0]) < 1e-12
    worst, where = worst_relative(ref.state(), checkpoint_state(ckpt))
    assert worst < 1e-9, where
    # the oracle moved: a broken optimizer step would not be caught otherwise
    fresh = ReferenceModel(graph, dtype="float64").state()
    assert worst_relative(fresh, checkpoint_state(ckpt))[0] > 1e-4


def test_each_rank_holds_only_its_shard_of_the_optimizer_state(hand_run):
    graph, plan, _, result, _, ref, _ = hand_run
    sizes = {  # trainable elements of every part, from the oracle's copy of the model
        p.key: sum(t.numel() for t in ref.store[p].parameters() if t.requires_grad)
        for p in ref.store.parts
    }
    sharded, unsharded = (
        result.extra["optimizer_state"],
        result.extra["compared_optimizer_state"][0],
    )
    for held, schedule, shard in (
        (sharded, build_schedule(graph, plan, 4), True),
        (unsharded, build_schedule(graph, h.sequential_plan(graph), 4), False),
    ):
        want: list[dict[str, int]] = [{} for _ in range(4)]
        for part, holders in schedule.holders:
            n = sizes[part.key]
            for (lo, hi), rank in zip(shard_bounds(n, len(holders)), holders, strict=True):
                mine = hi - lo if shard else n
                if mine:
                    want[rank][part.key] = 2 * mine  # exp_avg and exp_avg_sq, nothing else
        assert held == want
    # every trainable element has its state exactly once over the ranks when sharded
    total = 2 * sum(sizes.values())
    assert sum(sum(r.values()) for r in sharded) == total
    assert sum(sum(r.values()) for r in unsharded) > total  # sequential: 4 copies of each
    assert result.extra["optimizer_state_bytes"] == [8 * sum(r.values()) for r in sharded]


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
