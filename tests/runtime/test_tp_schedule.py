"""The plan's tensor-parallel layouts: their JSON form (plan format version 2) and what the
schedule makes of them (groups, leads, rows, flows, holders, and the layouts it refuses)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from spindle_dsl.backends.torch.parts import Part
from spindle_dsl.backends.torch.schedule import Stage, build_schedule
from spindle_dsl.errors import ExecutionError, PlanFormatError
from spindle_dsl.plan.model import Plan


@pytest.fixture(scope="module")
def graph(spec_dir):
    from spindle_dsl.language import compile_file

    return compile_file(spec_dir / "tiny_mm.spindle").graph


@pytest.fixture(scope="module")
def sequential(graph):
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.planner import make_plan

    return make_plan(graph, make_cost_model(graph.cluster, tp=1), scheduler="sequential")


def _with(plan, layouts: dict[str, tuple]) -> Plan:
    ops = tuple(
        dataclasses.replace(m, layout_per_layer=layouts.get(m.module, ())) for m in plan.metaops
    )
    return dataclasses.replace(plan, metaops=ops)


def test_a_stage_splits_rows_by_group():
    stage = Stage("m", 0, 0, 0, 2, (4, 5, 6, 7), True, tp=2)
    assert stage.leads == (4, 6)
    assert stage.groups == ((4, 5), (6, 7))
    assert stage.group_of(5) == (4, 5)
    assert [stage.rows(5, r) for r in stage.devices] == [(0, 3), (0, 3), (3, 5), (3, 5)]


def test_layouts_round_trip_and_version_1_reads_as_data_parallel(sequential):
    plan = _with(sequential, {"lm": ((4, (2, 2)),), "vision": ((4, (1, 4)),)})
    d = plan.to_dict()
    assert d["version"] == 2
    lm = next(m for m in d["metaops"] if m["module"] == "lm")
    assert lm["layout_per_layer"] == {"4": [2, 2]}
    again = Plan.from_dict(json.loads(json.dumps(d)))
    assert again.metaops == plan.metaops
    old = {**sequential.to_dict(), "version": 1}
    for m in Plan.from_dict(old).metaops:
        assert m.layout_at(4) == (4, 1) and m.layout_at(1) == (1, 1)


@pytest.mark.parametrize("bad", [[3, 2], [0, 4], [2]])
def test_an_impossible_layout_is_a_format_error(sequential, bad):
    d = sequential.to_dict()
    d["metaops"][0]["layout_per_layer"] = {"4": bad}
    with pytest.raises(PlanFormatError, match="layout_per_layer"):
        Plan.from_dict(d)


def test_the_schedule_moves_rows_between_leads_and_holds_parts_where_they_run(graph, sequential):
    plan = _with(sequential, {"lm": ((4, (1, 2)),), "vision": ((4, (2, 2)),)})
    schedule = build_schedule(graph, plan, 4)
    lm = schedule.chain("caption/lm")[0]
    assert (lm.tp, lm.devices, lm.leads) == (2, (0, 1), (0,))  # one replica: 2 devices idle
    vision = schedule.chain("caption/vision")[0]
    assert (vision.tp, vision.leads) == (2, (0, 2))
    into_lm = next(f for f in schedule.flows if f.key.startswith("caption/lm<"))
    assert into_lm.dst == (0,)
    holders = schedule.holder_map
    assert holders[Part("lm", "layer.0")] == (0, 1)  # every rank of the group holds the layer
    # the group scores the lm loss together, split by vocabulary: both hold the head
    assert holders[Part("lm", "head")] == (0, 1)
    assert schedule.vocab_split == {"caption/lm", "transcribe/lm"}
    assert holders[Part("vision", "input.image")] == (0, 2)  # the leads embed the raw rows
    assert schedule.tp_groups == ((0, 1), (2, 3))
    assert schedule.loss_group("caption") == (0,)


def test_a_degree_the_layers_cannot_split_into_is_refused(graph, sequential):
    plan = _with(sequential, {"lm": ((4, (1, 3)),)})  # 4 heads do not split 3-way
    with pytest.raises(ExecutionError, match=r"runs module lm 3-way: .*heads"):
        build_schedule(graph, plan, 4)


def test_the_wave_table_text_and_timeline_name_each_entrys_layout(sequential):
    from spindle_dsl.cli.cmd_plan import wave_table
    from spindle_dsl.render.schedule import placed_entries
    from spindle_dsl.render.text import waves_text
    from spindle_dsl.render.timeline import entry_labels

    plan = _with(sequential, {"lm": ((4, (2, 2)),)})
    assert "dp x tp" in wave_table(plan) and "2x2" in wave_table(plan)
    assert "dp x tp 2x2" in waves_text(plan)
    labels = {p.op.module: entry_labels(p)[0] for p in placed_entries(plan)}
    assert labels["lm"].endswith("2x2 tp") and "tp" not in labels["vision"]
    assert "dp x tp" not in wave_table(sequential)
