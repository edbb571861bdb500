"""The Chrome trace: valid events, a process per node, a thread per device, paired flows."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from spindle_dsl.render.trace import (
    Flow,
    FlowEnd,
    Span,
    check_trace,
    chrome_trace,
    plan_trace,
    write_trace,
)


def _events(trace, ph):
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def test_plan_trace_is_valid(plan):
    assert check_trace(plan_trace(plan)) == []


def test_a_process_per_node_and_a_thread_per_device(plan):
    trace = plan_trace(plan)
    procs = {
        e["pid"]: e["args"]["name"] for e in _events(trace, "M") if e["name"] == "process_name"
    }
    threads = [(e["pid"], e["tid"]) for e in _events(trace, "M") if e["name"] == "thread_name"]
    assert procs == {0: "node 0", 1: "node 1"}
    assert sorted(threads) == [(0, 0), (0, 1), (1, 2), (1, 3)]  # 2 devices per node
    for e in _events(trace, "X"):
        assert e["pid"] == e["tid"] // 2


def test_a_complete_event_per_entry_per_device_with_args(plan):
    trace = plan_trace(plan)
    xs = _events(trace, "X")
    assert len(xs) == sum(len(e.devices) for w in plan.waves for e in w.entries)
    last = [e for e in xs if e["args"]["metaop"] == "caption/lm" and e["args"]["wave"] == 3]
    assert sorted(e["tid"] for e in last) == [0, 1]
    ev = last[0]
    assert ev["args"]["task"] == "caption" and ev["args"]["layers"] == [3, 6]
    assert ev["ts"] == plan.waves[3].start_s * 1e6
    assert abs(ev["dur"] - ev["args"]["predicted_s"] * 1e6) < 1e-6
    assert ev["name"] == "caption/lm [3,6)"


def test_flows_pair_and_bind_to_their_entries(plan):
    trace = plan_trace(plan)
    starts, finishes = _events(trace, "s"), _events(trace, "f")
    assert len(starts) == len(finishes) == 5
    assert sorted(e["id"] for e in starts) == sorted(e["id"] for e in finishes)
    assert len({e["id"] for e in starts}) == 5
    by_id = {e["id"]: e for e in finishes}
    kinds = sorted(e["args"]["kind"] for e in starts)
    assert kinds == ["dep", "dep", "dep", "dep", "layers"]
    for s in starts:
        f = by_id[s["id"]]
        assert s["ts"] < f["ts"] and f["bp"] == "e"


def test_trace_round_trips_through_json(plan, tmp_path):
    path = tmp_path / "t.json"
    write_trace(path, plan_trace(plan))
    assert check_trace(json.loads(path.read_text())) == []


def test_generic_spans_for_measured_runs():
    spans = [
        Span(0, 0, "fwd a", 0.0, 0.5, args={"step": 1}),
        Span(1, 8, "fwd b", 0.6, 0.2, category="measured"),
    ]
    flows = [Flow(7, "act", FlowEnd(0, 0, 0.49), FlowEnd(1, 8, 0.61))]
    trace = chrome_trace(spans, flows, node_names={1: "host-b"}, metadata={"run": "x"})
    assert check_trace(trace) == []
    names = {
        e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {0: "node 0", 1: "host-b"}
    assert trace["metadata"] == {"run": "x"}


def test_check_trace_finds_broken_traces(plan):
    trace = plan_trace(plan)
    events = trace["traceEvents"]
    one_start = next(e for e in events if e["ph"] == "s")
    broken = {"traceEvents": [e for e in events if e is not one_start]}
    assert any("0 start(s)" in p for p in check_trace(broken))
    no_names = {"traceEvents": [e for e in events if e.get("name") != "thread_name"]}
    assert any("no thread_name" in p for p in check_trace(no_names))
    outside = [dict(e, ts=1e12) if e is one_start else e for e in events]
    assert any("lies in no slice" in p for p in check_trace({"traceEvents": outside}))
    assert check_trace({}) == ["no traceEvents list"]
    assert any("missing dur" in p for p in check_trace({"traceEvents": [{"ph": "X", "name": "a",
               "ts": 0, "pid": 0, "tid": 0}]}))  # fmt: skip


def test_time_after_the_waves_is_an_overhead_span_per_device(plan):
    longer = replace(
        plan,
        iteration_s=plan.iteration_s + 0.05,
        breakdown=(("compute_s", plan.iteration_s), ("transfer_s", 0.04), ("grad_sync_s", 0.01)),
    )
    trace = plan_trace(longer)
    assert check_trace(trace) == []
    tail = [e for e in _events(trace, "X") if e["cat"] == "overhead"]
    assert sorted(e["tid"] for e in tail) == [0, 1, 2, 3]
    assert tail[0]["name"] == "transfer + grad sync"
    assert tail[0]["ts"] + tail[0]["dur"] == pytest.approx(longer.iteration_s * 1e6)
    assert not [e for e in _events(plan_trace(plan), "X") if e["cat"] == "overhead"]


def test_package_exports_load_lazily():
    import spindle_dsl.render as render

    for name in render.__all__:
        assert callable(getattr(render, name))
    with pytest.raises(AttributeError):
        render.nothing_here  # noqa: B018
