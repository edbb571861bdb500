"""The reference workloads (tiny_mm, multitask_clip) through the real pipeline (compile, cost,
plan) and every renderer: valid trace, DOT naming every MetaOp, and each rendering under the
2 s target."""

from __future__ import annotations

import time

import pytest

from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_file
from spindle_dsl.planner import make_plan
from spindle_dsl.render.dot_metagraph import metagraph_dot
from spindle_dsl.render.dot_waves import waves_dot
from spindle_dsl.render.graphviz_tools import dot_available, render_dot
from spindle_dsl.render.report import build_report
from spindle_dsl.render.text import timeline_text
from spindle_dsl.render.timeline import timeline_bytes
from spindle_dsl.render.trace import check_trace, plan_trace

FIXTURES = ("tiny_mm", "multitask_clip")
TARGET_S = 2.0


@pytest.fixture(scope="module", params=FIXTURES)
def planned(request, spec_dir):
    graph = compile_file(str(spec_dir / f"{request.param}.spindle")).graph
    return graph, make_plan(graph, make_cost_model(graph.cluster))


def _timed(fn):
    """Best of two runs: the suite shares its cores, one slow run is not the renderer's cost."""
    best, out = float("inf"), None
    for _ in range(2):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def test_fixture_pictures_and_trace(planned):
    graph, plan = planned
    mg, wv = metagraph_dot(graph).source, waves_dot(plan).source
    for m in graph.metaops:
        assert f'"{m.id}"' in mg
    placed = {e.metaop for w in plan.waves for e in w.entries}
    for w in plan.waves:
        assert f"cluster_wave_{w.index}" in wv
    assert placed == {m.id for m in graph.metaops}
    trace = plan_trace(plan)
    assert check_trace(trace) == []
    threads = {e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == set(range(plan.cluster.devices))
    assert timeline_text(plan).count("\n") >= 3


def test_fixture_renders_in_under_two_seconds(planned):
    graph, plan = planned

    def draw(dot):
        return render_dot(dot, "svg") if dot_available() else dot.source

    times = {
        "metagraph": _timed(lambda: draw(metagraph_dot(graph)))[0],
        "waves": _timed(lambda: draw(waves_dot(plan)))[0],
        "timeline": _timed(lambda: timeline_bytes(plan, "svg"))[0],
        "trace": _timed(lambda: plan_trace(plan))[0],
        "report": _timed(lambda: build_report(plan, graph))[0],
    }
    assert max(times.values()) < TARGET_S, times
