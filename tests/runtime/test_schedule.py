"""The plan compiled for the runtime: shards, moves, flows, holders, and refused plans."""

from __future__ import annotations

import dataclasses
import itertools

import handgraph as h
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spindle_dsl.backends.torch.parts import Part, graph_parts
from spindle_dsl.backends.torch.schedule import build_schedule, moves, shard_bounds
from spindle_dsl.errors import ExecutionError
from spindle_dsl.plan.model import Entry

groups = st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True).map(tuple)


@given(batch=st.integers(0, 40), n=st.integers(1, 9))
def test_shards_are_contiguous_ceil_splits(batch, n):
    bounds = shard_bounds(batch, n)
    assert len(bounds) == n
    assert bounds[0][0] == 0 and bounds[-1][1] == batch
    for (a, b), (c, _) in itertools.pairwise(bounds):
        assert b == c and a <= b
    assert max(b - a for a, b in bounds) == -(-batch // n)


@given(batch=st.integers(1, 40), src=groups, dst=groups)
def test_moves_deliver_every_row_once_from_its_holder(batch, src, dst):
    got = moves(batch, src, dst)
    rows = sorted(r for m in got for r in range(m.lo, m.hi))
    assert rows == list(range(batch))
    src_of = {
        r: d
        for d, (a, b) in zip(src, shard_bounds(batch, len(src)), strict=True)
        for r in range(a, b)
    }
    dst_of = {
        r: d
        for d, (a, b) in zip(dst, shard_bounds(batch, len(dst)), strict=True)
        for r in range(a, b)
    }
    for m in got:
        assert all(src_of[r] == m.src and dst_of[r] == m.dst for r in range(m.lo, m.hi))


def test_flows_and_holders_of_a_hand_plan():
    graph = h.tiny_mm(4)
    sched = build_schedule(graph, h.make_plan(graph, h.TINY_WAVES), 4)
    flows = {f.key: f for f in sched.flows}
    # caption/vision hands layers 2-3 from 3 devices to 2; lm reads vision_proj on device 3
    assert flows["caption/vision#1"].src == (0, 1, 2)
    assert flows["caption/vision#1"].dst == (0, 1)
    assert flows["caption/vision#1"].tail == (16, 64)
    assert flows["caption/lm<0"].src == (3,) and flows["caption/lm<0"].tail == (16, 96)
    assert flows["caption/lm#1"].phase == 4 and flows["caption/lm#1"].dst == (1, 3)
    holders = sched.holder_map
    # layer 3 of lm: caption runs it on 0-3 (wave 3), transcribe on 0,2 (wave 4)
    assert holders[Part("lm", "layer.3")] == (0, 1, 2, 3)
    assert holders[Part("lm", "layer.5")] == (0, 1, 2, 3)
    assert holders[Part("lm", "layer.0")] == (0, 1, 2, 3)
    assert holders[Part("vision", "layer.3")] == (0, 1)
    assert holders[Part("vision", "input.image")] == (0, 1, 2)
    assert holders[Part("hearing", "input.audio")] == (3,)
    assert holders[Part("lm", "head")] == (0, 1, 2, 3)
    assert holders[Part("lm", "input.text")] == (0, 1, 2, 3)
    assert set(holders) == set(graph_parts(graph))
    assert sched.parts_of(3) == tuple(p for p, r in sched.holders if 3 in r)


def test_contrastive_loss_gathers_on_one_device():
    graph = h.clip_like(4)
    sched = build_schedule(graph, h.make_plan(graph, h.CLIP_WAVES), 4)
    loss = [f for f in sched.flows if f.key.startswith("loss:imu_text")]
    assert [f.src for f in loss] == [(0,), (2, 3)]
    assert all(f.dst == (0,) and f.tail == (24,) for f in loss)
    assert sched.loss_group("imu_text") == (0,)
    # the frozen encoder's output takes no gradient back
    assert not next(f for f in sched.flows if f.key == "image_text/img_head<0").backward


def _broken(plan, **wave_changes):
    waves = list(plan.waves)
    for index, entries in wave_changes.items():
        i = int(index[1:])
        waves[i] = dataclasses.replace(waves[i], entries=entries)
    return dataclasses.replace(plan, waves=tuple(waves))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p, "the plan is for 4 devices but 2 processes"),
        (
            lambda p: _broken(p, w0=(Entry("caption/vision", 0, 2, (0, 1, 7), 0.0),)),
            "uses devices [0, 1, 7]",
        ),
        (
            lambda p: _broken(
                p,
                w4=(
                    Entry("caption/lm", 4, 5, (1, 3), 0.0),
                    Entry("transcribe/lm", 3, 6, (0, 2), 0.0),
                ),
            ),
            "caption/lm: the plan covers 5 of 6 layers",
        ),
        (
            lambda p: _broken(
                p,
                w1=(
                    Entry("caption/vision", 2, 4, (0, 1), 0.0),
                    Entry("transcribe/audio_proj", 0, 1, (1, 3), 0.0),
                ),
            ),
            "devices [1] twice",
        ),
    ],
)
def test_plans_the_runtime_cannot_run_are_refused(edit, message):
    graph = h.tiny_mm(4)
    plan = edit(h.make_plan(graph, h.TINY_WAVES))
    world = 2 if "2 processes" in message else 4
    with pytest.raises(ExecutionError, match="cannot run this plan") as err:
        build_schedule(graph, plan, world)
    assert message in str(err.value)


def test_dependency_order_is_checked():
    graph = h.tiny_mm(4)
    waves = [list(w) for w in h.TINY_WAVES]
    waves[0].append(("caption/vision_proj", 0, 1, (3,)))
    waves[2] = [e for e in waves[2] if e[0] != "caption/vision_proj"]
    waves[0][1] = ("transcribe/hearing", 0, 2, (2,))  # keep devices disjoint
    waves[0][0] = ("caption/vision", 0, 2, (0, 1))
    with pytest.raises(ExecutionError, match="caption/vision_proj starts in wave 0 before"):
        build_schedule(graph, h.make_plan(graph, waves), 4)


def test_a_plan_for_another_spec_is_refused():
    graph = h.tiny_mm(4)
    other = h.clip_like(4)
    with pytest.raises(ExecutionError, match="MetaOp caption/vision of the spec is not in"):
        build_schedule(graph, h.sequential_plan(other), 4)
