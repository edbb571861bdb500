"""When each part's gradient is final on each holder, and how parts are cut into buckets that
every holder issues in the same order (plain Python: no process group needed)."""

from __future__ import annotations

import handgraph as h
import torch
from hypothesis import given
from hypothesis import strategies as st

from spindle_dsl.backends.torch.grads import ready_ticks
from spindle_dsl.backends.torch.parts import Part
from spindle_dsl.backends.torch.schedule import build_schedule
from spindle_dsl.backends.torch.shards import least_bucket_elements, plan_buckets


def test_a_part_is_ready_after_its_last_backward_on_each_holder():
    graph = h.tiny_mm(4)
    schedule = build_schedule(graph, h.make_plan(graph, h.TINY_WAVES), 4)
    ticks = ready_ticks(graph, schedule)
    holders = schedule.holder_map
    # 5 waves: tick 0 is the loss, tick 5 - w the backward of wave w
    assert ticks[Part("lm", "head")] == (0, 0, 0, 0)  # only the losses touch heads
    # caption/lm runs layers 4-5 in wave 4 on ranks 1 and 3, transcribe/lm on 0 and 2
    assert ticks[Part("lm", "layer.5")] == (1, 1, 1, 1)
    # layer 3: wave 3 on every rank (caption/lm [0,4)) comes after wave 4 in the backward
    assert ticks[Part("lm", "layer.3")] == (2, 2, 2, 2)
    # layer 0 and the text input stage: transcribe/lm [0,3) on ranks 0-2 in wave 2, but
    # rank 3 runs lm only from wave 3 (caption/lm)
    assert holders[Part("lm", "layer.0")] == (0, 1, 2, 3)
    assert ticks[Part("lm", "layer.0")] == ticks[Part("lm", "input.text")] == (3, 3, 3, 2)
    # a shared encoder's input stage goes with its first stage
    assert ticks[Part("vision", "input.image")] == (5, 5, 5)
    assert ticks[Part("vision", "layer.3")] == (4, 4)


def test_buckets_follow_the_backward_and_close_when_the_group_tick_moves():
    ranks = (0, 1)
    parts = [(Part("m", f"layer.{i}"), ranks, 100_000) for i in range(4)]
    parts.append((Part("m", "head"), ranks, 10))  # small
    parts.append((Part("n", "layer.0"), ranks, 10))  # small, later tick
    ready = {
        Part("m", "layer.0"): (3, 2),
        Part("m", "layer.1"): (3, 2),
        Part("m", "layer.2"): (1, 2),
        Part("m", "layer.3"): (1, 1),
        Part("m", "head"): (0, 0),
        Part("n", "layer.0"): (4, 0),
    }
    buckets = plan_buckets(parts, 1 << 30, ready, min_elements=1000)
    names = [[ps.part.key for ps in b.parts] for b in buckets]
    # sorted by group tick (latest over the holders): head 0, layer.3 1, layer.2 2, ...; the
    # head's bucket is below the minimum, so it stays open for the next tick's parts
    assert names == [
        ["m/head", "m/layer.3"],
        ["m/layer.2"],
        ["m/layer.1", "m/layer.0"],  # within a tick, the backward's order: later layers first
        ["n/layer.0"],
    ]
    # a bucket is ready on a holder when its last part is
    assert [b.ready for b in buckets] == [(1, 1), (1, 2), (3, 2), (4, 0)]
    assert buckets[2].ready_on(1) == 2
    # a size cap splits one tick's parts
    capped = plan_buckets(parts, 150_000, ready, min_elements=1000)
    assert [[ps.part.key for ps in b.parts] for b in capped][2:4] == [["m/layer.1"], ["m/layer.0"]]


def test_where_ranks_share_cores_buckets_fill_to_the_cap():
    """Ranks that outnumber their cores overlap nothing with an early collective, so the
    buckets close only at the cap: the parts above, under a cap they fit, in one bucket."""
    ranks = (0, 1)
    parts = [(Part("m", f"layer.{i}"), ranks, 100_000) for i in range(4)]
    ready = {Part("m", f"layer.{i}"): (i, i) for i in range(4)}
    cap = 1 << 20
    assert least_bucket_elements(False, cap) < cap
    apart = plan_buckets(parts, cap, ready, min_elements=least_bucket_elements(False, cap))
    shared = plan_buckets(parts, cap, ready, min_elements=least_bucket_elements(True, cap))
    assert len(apart) == 4
    assert len(shared) == 1 and len(shared[0].parts) == 4


ticks = st.integers(0, 6)


@given(
    parts=st.lists(
        st.tuples(st.sampled_from([(0,), (0, 1), (1, 2, 3)]), st.integers(0, 50), st.data()),
        min_size=1,
        max_size=12,
    ),
    cap=st.integers(1, 120),
    least=st.integers(0, 60),
)
def test_every_holder_gets_the_same_buckets_in_the_same_order(parts, cap, least):
    held, ready = [], {}
    for i, (holders, n, data) in enumerate(parts):
        part = Part("m", f"layer.{i}")
        held.append((part, holders, n))
        ready[part] = tuple(data.draw(ticks) for _ in holders)
    buckets = plan_buckets(held, cap, ready, min_elements=least)
    placed = sorted(ps.part for b in buckets for ps in b.parts)
    assert placed == sorted(p for p, _, n in held if n > 0)
    for b in buckets:
        for i, rank in enumerate(b.holders):
            assert b.ready_on(rank) == max(ready[ps.part][i] for ps in b.parts)
    # within a holder set, buckets come by group tick (the latest over the holders)
    for holders in {b.holders for b in buckets}:
        group = [max(b.ready) for b in buckets if b.holders == holders]
        assert group == sorted(group)
    # what a rank computes from its own parts alone is the same (the holders agree)
    for holders in {b.holders for b in buckets}:
        mine = [x for x in held if x[1] == holders]
        again = plan_buckets(mine, cap, ready, min_elements=least)
        assert again == tuple(b for b in buckets if b.holders == holders)


def _model_buckets(graph, waves):
    """The step model's buckets (holders, bytes) of hand-made waves."""
    from spindle_dsl.cost.overheads import analytic_overheads
    from spindle_dsl.cost.step import PieceTime, make_step_model

    step = make_step_model(graph, analytic_overheads(graph.cluster), grad_in_curves=False)
    pieces = [[PieceTime(op, a, b, devs, 0.01) for op, a, b, devs in w] for w in waves]
    return sorted(
        (ranks, int(nbytes)) for ranks, nbytes, *_ in step._buckets(step._holders(pieces))
    )


def _runtime_buckets(graph, waves):
    """The runtime's buckets (holders, bytes) of the same waves, as every holder cuts them."""
    schedule = build_schedule(graph, h.make_plan(graph, waves), graph.cluster.devices)
    holders, ticks = schedule.holder_map, ready_ticks(graph, schedule)
    shared = [p for p in holders if len(holders[p]) > 1]
    held = [(p, holders[p], _trainable_elements(graph, p)) for p in shared]
    buckets = plan_buckets(held, ready=ticks)
    dt = graph.dtype_bytes
    return sorted((b.holders, sum(ps.numel for ps in b.parts) * dt) for b in buckets)


def _trainable_elements(graph, part):
    from spindle_dsl.backends.torch.params import PartStore

    store = PartStore(graph, [part], seed=0, dtype=torch.float32)
    return sum(t.numel() for t in store[part].parameters() if t.requires_grad)


def test_the_step_model_cuts_gradient_buckets_as_the_runtime_does():
    """One collective per bucket, each paying its latency: the model must count the buckets
    the runtime issues (a bucket closes where the backward moves to the next wave)."""
    from pathlib import Path

    from spindle_dsl.language import compile_file

    spec = Path(__file__).resolve().parents[2] / "examples" / "tiny_mm.spindle"
    graph = compile_file(str(spec), cluster_overrides={"devices": 4}).graph
    for waves in (h.TINY_WAVES, [[(m.id, 0, m.layers, (0, 1, 2, 3))] for m in graph.metaops]):
        model, runtime = _model_buckets(graph, waves), _runtime_buckets(graph, waves)
        assert len(runtime) > len({r for r, _ in runtime})  # several buckets per holder set
        assert model == runtime
