"""The widget's light pictures (one bar per device run of each entry, memory against capacity)
and its summary of the memory levers."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace

from spindle_dsl.plan import ClusterRef, Entry, Plan, PlanMetaOp, SolverInfo, SpecRef, Wave
from spindle_dsl.widgets.memory_svg import OVER_FILL, memory_svg
from spindle_dsl.widgets.summary import summarize, summary_html
from spindle_dsl.widgets.timeline_svg import timeline_svg

SVG = "{http://www.w3.org/2000/svg}"


def plan(memory: tuple[int, ...] = (), capacity: int = 100) -> Plan:
    ops = (
        PlanMetaOp("t/enc", "t", "enc", "vit", 4, 8, 16, (), 1e9, 1000, ((1, 2.0), (3, 0.8))),
        PlanMetaOp("u/lm", "u", "lm", "transformer", 2, 8, 20, (), 2e9, 2000, ((1, 1.0),)),
    )
    waves = (
        Wave(0, 0.0, 3.2, (Entry("t/enc", 0, 4, (0, 1, 3), 3.2), Entry("u/lm", 0, 2, (2,), 2.0))),
    )
    return Plan(
        SpecRef("x.spindle", "", None),
        ClusterRef(4, "cpu", 4, capacity),
        ops,
        waves,
        3.2,
        3.0,
        (("sequential_s", 5.2),),
        SolverInfo("paper", "heuristic", 0.01),
        memory_bytes=memory,
    )


def bars(svg: str) -> list[ET.Element]:
    return [r for r in ET.fromstring(svg).iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]


def test_timeline_draws_a_bar_per_run_of_consecutive_devices():
    got = bars(timeline_svg(plan()))
    titles = sorted(r.find(f"{SVG}title").text for r in got)
    # t/enc on devices 0,1,3 is two runs (0-1 and 3); u/lm on device 2 is one
    assert len(got) == 3
    assert titles[0].startswith("t/enc [0,4) on 3 devices") and titles[2].startswith("u/lm")
    widths = {r.find(f"{SVG}title").text.split()[0]: float(r.get("width")) for r in got}
    assert widths["t/enc"] > widths["u/lm"]  # 3.2 s against 2.0 s


def test_memory_bars_turn_red_over_capacity():
    got = bars(memory_svg(plan(memory=(50, 120, 10, 100))))
    assert [r.get("fill") == OVER_FILL for r in got] == [False, True, False, False]
    heights = [float(r.get("height")) for r in got]
    assert heights[1] > heights[3] > heights[0] > heights[2]


def test_memory_chart_says_when_the_plan_has_no_figures():
    assert "does not predict memory" in memory_svg(plan())


def test_summary_shows_the_memory_levers_and_the_peak_against_capacity():
    p = plan(memory=(50, 80, 10, 100), capacity=100)
    rc = tuple(replace(m, recompute=m.id == "u/lm") for m in p.metaops)
    s = summarize(replace(p, micro_batches=8, zero_stage=2, metaops=rc))
    assert (s.micro_batches, s.zero_stage, s.recompute) == (8, 2, ("u/lm",))
    html = summary_html(s)
    assert "memory levers" in html and "8 micro-batches, ZeRO-2, recompute 1/2" in html
    assert "(100%, fits), least" in html


def test_a_plan_without_levers_says_one_micro_batch():
    html = summary_html(summarize(plan(memory=(50, 120, 10, 100))))
    assert "1 micro-batch, ZeRO-1, recompute 0/2" in html and "does not fit" in html
