"""Spreading lm losses over the devices that hold their head (``planner.evaluate.relabel``)."""

from __future__ import annotations

import dataclasses

import pytest
from test_lossbalance import EVERYWHERE, SPEC, _evaluated, _pp

from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.comm import _shard_moves
from spindle_dsl.cost.step import PieceTime, ceil_split, spread_shares
from spindle_dsl.language import compile_text
from spindle_dsl.plan.model import Plan
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner.evaluate.build import context, to_plan
from spindle_dsl.planner.evaluate.relabel import (
    SPREAD_LOSS_NOTE,
    balanced_groups,
    loss_loads,
    shard_order,
    spread_losses,
)

# the sinks end on disjoint groups covering the cluster (nothing to relabel), sized for their
# layers: transcribe's 128 rows are scored on one device, caption's on three
SPLIT = (
    (_pp("caption/vision", 0, 4, (0, 1, 2)), _pp("transcribe/hearing", 0, 2, (3,))),
    (_pp("caption/vision_proj", 0, 1, (0, 1, 2)), _pp("transcribe/audio_proj", 0, 1, (3,))),
    (_pp("caption/lm", 0, 6, (0, 1, 2)), _pp("transcribe/lm", 0, 6, (3,))),
)


@pytest.fixture(scope="module")
def ctx():
    graph = compile_text(SPEC, path="<lossspread>").graph
    return context(graph, make_cost_model(graph.cluster))


def test_ceil_split_is_the_runtimes_split_and_positions_are_its_unit(ctx):
    assert ceil_split(10, 4) == [3, 3, 3, 1]
    assert ceil_split(4, 3) == [2, 2, 0]
    assert ceil_split(0, 2) == [0, 0]
    sink = next(s for s in ctx.step.sinks if s.sink == "transcribe/lm")
    assert sink.positions == 63
    # 3 rows of 63 positions over 2 devices: 95 and 94 positions, not 2 rows and 1
    assert spread_shares(sink, 3, 1, 2) == [95 / 63, 94 / 63]


def test_a_spread_sink_is_priced_on_its_groups_rows(ctx):
    step = ctx.step
    waves = [[PieceTime(p.op, p.first, p.end, p.devices, 0.0) for p in w] for w in SPLIT]
    alone = step.loss_load(waves, 1)
    spread = step.loss_load(waves, 1, {"transcribe/lm": (3, 2)}, {3: 0.5})
    sink = next(s for s in step.sinks if s.sink == "transcribe/lm")
    assert alone[3] == pytest.approx(step.loss_seconds(sink, 128))
    # 64 rows each on devices 3 and 2, plus the moves charged to device 3
    assert spread[3] == pytest.approx(step.loss_seconds(sink, 64) + 0.5)
    assert spread[2] == pytest.approx(alone[2] + step.loss_seconds(sink, 64))
    assert spread[0] == pytest.approx(alone[0])


def test_the_greedy_groups_fill_the_least_loaded_devices_row_by_row(ctx):
    step = ctx.step
    sink = next(s for s in step.sinks if s.sink == "transcribe/lm")
    load = {0: 1.0, 1: 1.0, 2: 1.0}  # caption's loss, staying where it ends
    groups = balanced_groups(step, [sink], (0, 1, 2, 3), load, {"transcribe/lm": (3,)}, 1, 4)
    group = groups["transcribe/lm"]
    assert 3 in group  # the idle device, which holds the rows
    assert len(group) == len(set(group)) and set(group) <= {0, 1, 2, 3}
    shares = spread_shares(sink, 128, 1, len(group))
    assert sum(shares) == pytest.approx(128)
    assert max(load.values()) < 1.0 + step.loss_seconds(sink, 128)


def test_a_group_in_shard_order_keeps_rows_on_their_devices_and_inside_their_nodes():
    # two nodes of 8; the rows on 0, 1 (node 0) and 8, 9 (node 1), spread over 8 devices that
    # came in the order of their loads
    source, chosen = (0, 1, 8, 9), [12, 3, 9, 2, 0, 13, 1, 8]
    in_load_order = _shard_moves(list(source), chosen)
    assert any(s // 8 != d // 8 for s, d in in_load_order)  # that order crosses nodes
    group = shard_order(source, chosen, 8, keep_last=False)
    assert sorted(group) == sorted(chosen)
    moves = _shard_moves(list(source), list(group))
    assert all(s // 8 == d // 8 for s, d in moves)  # nothing crosses a node
    # each source keeps half its rows: it scores one of the two slots its shard holds
    assert sum(moves.values()) == pytest.approx(0.5)
    assert sum(in_load_order.values()) > 0.5
    # the last device scores the short share the group's size was chosen with
    assert shard_order(source, chosen, 8, keep_last=True)[-1] == chosen[-1]
    # a source outside the group sends its rows to its own node where it can
    assert all(
        s // 8 == d // 8
        for s, d in _shard_moves([0, 8], list(shard_order((0, 8), [1, 9], 8, False)))
    )


def test_spreading_evens_a_loss_phase_relabeling_cannot(ctx):
    before = _evaluated(ctx, SPLIT)
    after = spread_losses(ctx, before)
    groups = dict(after.placement.loss_groups)
    assert set(groups) == {"transcribe/lm"} or set(groups) == {"transcribe/lm", "caption/lm"}
    assert len(groups["transcribe/lm"]) > 1
    assert after.timing.loss_s < 0.75 * before.timing.loss_s
    assert after.iteration_s < before.iteration_s
    assert any(n.startswith(SPREAD_LOSS_NOTE) for n in after.schedule.notes)
    # the loss tensors moved with the rows: device 3 holds fewer, the others more
    assert after.placement.memory[3] < before.placement.memory[3]
    assert after.placement.memory[0] > before.placement.memory[0]
    # the same waves; relabeling alone finds nothing here
    assert after.placement.waves == before.placement.waves
    assert loss_loads(ctx.step, SPLIT, 1) == loss_loads(ctx.step, after.placement.waves, 1)


def test_the_plan_carries_the_loss_devices_through_its_json(ctx):
    after = spread_losses(ctx, _evaluated(ctx, SPLIT))
    others = dict.fromkeys(("sequential", "distmm", "optimus"), after.iteration_s)
    plan = to_plan(ctx, after, lower_bound_s=0.0, baselines=others, wall_s=0.0, notes=(), extra={})
    assert plan.loss_devices == after.placement.loss_groups
    assert validate_plan(plan) == []
    again = Plan.from_dict(plan.to_dict())
    assert again.loss_devices == plan.loss_devices
    assert "loss_devices" not in Plan.from_dict({**plan.to_dict(), "loss_devices": {}}).extra
    wrong = dataclasses.replace(plan, loss_devices=(("nope/lm", (0,)), ("caption/lm", (9,))))
    assert validate_plan(wrong) == [
        "loss_devices: unknown MetaOp 'nope/lm'",
        "loss_devices: 'caption/lm' scores on device 9, outside [0, 4)",
    ]


def test_sinks_already_on_every_device_of_their_head_stay(ctx):
    ev = _evaluated(ctx, EVERYWHERE)
    assert spread_losses(ctx, ev) is ev
