"""When each part's gradient is final on each holder, and how parts are cut into buckets that
every holder issues in the same order (plain Python: no process group needed)."""

from __future__ import annotations

import handgraph as h
from hypothesis import given
from hypothesis import strategies as st

from spindle_dsl.backends.torch.grads import ready_ticks
from spindle_dsl.backends.torch.parts import Part
from spindle_dsl.backends.torch.schedule import build_schedule
from spindle_dsl.backends.torch.shards import plan_buckets


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
        ["m/layer.0", "m/layer.1"],
        ["n/layer.0"],
    ]
    # a bucket is ready on a holder when its last part is
    assert [b.ready for b in buckets] == [(1, 1), (1, 2), (3, 2), (4, 0)]
    assert buckets[2].ready_on(1) == 2
    # a size cap splits one tick's parts
    capped = plan_buckets(parts, 150_000, ready, min_elements=1000)
    assert [[ps.part.key for ps in b.parts] for b in capped][2:4] == [["m/layer.0"], ["m/layer.1"]]


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
