"""One colour per task, in task order, and the same colour in every picture."""

from __future__ import annotations

import re

import pytest

from spindle_dsl.render.colors import BASE_HUES, palette, task_order, text_on
from spindle_dsl.render.dot_metagraph import metagraph_dot
from spindle_dsl.render.dot_waves import waves_dot
from spindle_dsl.render.report import build_report
from spindle_dsl.render.schedule import plan_palette
from spindle_dsl.render.timeline import timeline_bytes


def test_colours_follow_task_order_not_names():
    a = palette(["zeta", "alpha"])
    b = palette(["alpha", "zeta"])
    assert a["zeta"].base == BASE_HUES[0] == b["alpha"].base
    assert a["alpha"].base == BASE_HUES[1]


def test_many_tasks_get_distinct_colours():
    p = palette([f"t{i}" for i in range(25)])
    assert len({c.base for c in p.colours}) == 25
    assert len({c.light for c in p.colours}) == 25


def test_unknown_task_is_a_clear_key_error():
    with pytest.raises(KeyError, match="no colour"):
        palette(["a"])["b"]


def test_text_colour_reads_on_its_background():
    assert text_on("#ffffff") == "#000000"
    assert text_on("#000000") == "#ffffff"


def test_task_order_appends_tasks_that_run_nothing():
    assert task_order(["b", "a", "b"], ["a", "c", "b"]) == ("b", "a", "c")


def test_graph_and_plan_give_the_same_palette(graph, plan):
    assert palette(task_order(m.task for m in graph.metaops)) == plan_palette(plan)


def test_every_picture_uses_the_task_colour(graph, plan, no_dot):
    colours = plan_palette(plan)
    caption, transcribe = colours["caption"], colours["transcribe"]
    mg, wv = metagraph_dot(graph).source, waves_dot(plan).source
    tl = timeline_bytes(plan, "svg").decode()
    html = build_report(plan, graph).html
    for c in (caption, transcribe):
        assert c.light in mg and c.base in mg
        assert c.light in wv and c.base in wv
        assert c.base in tl  # matplotlib writes fill colours as #rrggbb
        assert c.base in html
    # the caption MetaOp boxes carry the caption colour, not the other task's
    box = re.search(r'"caption/vision" \[[^\]]*\]', mg)
    assert box and caption.light in box.group(0) and transcribe.light not in box.group(0)
