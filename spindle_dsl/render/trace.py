"""Chrome trace JSON (opens in Perfetto and chrome://tracing) for predicted and measured runs.

The format is the Trace Event Format: ``{"traceEvents": [...]}`` with times in microseconds.
This module maps the project's picture of a run onto it the same way for every producer:
a process per node (``pid`` = node index), a thread per device (``tid`` = global device id),
a complete event (``ph: "X"``) per span, and flow events (``ph: "s"`` then ``"f"``, sharing an
``id``) for activations that move between device groups.

Producers only build ``Span`` and ``Flow`` values: ``plan_trace`` does it for a predicted plan,
and the runtime can do it for measured timings (node, device, name, start, duration, args) and
call ``chrome_trace`` / ``write_trace``, so predicted and measured traces line up side by side.
``check_trace`` says what is wrong with a trace, for tests on either side.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spindle_dsl.atomic import write_atomic
from spindle_dsl.plan.model import Plan
from spindle_dsl.render.schedule import activation_flows, overhead, placed_entries

US = 1e6  # trace times are microseconds


@dataclass(frozen=True)
class Span:
    """Something a device did from ``start_s`` for ``duration_s`` (seconds from run start)."""

    node: int
    device: int
    name: str
    start_s: float
    duration_s: float
    category: str = "compute"
    args: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class FlowEnd:
    """One end of a flow: a point in time on a device, inside the span it should attach to."""

    node: int
    device: int
    at_s: float


@dataclass(frozen=True)
class Flow:
    """Data moving from ``src`` to ``dst``; ``id`` must be unique within a trace."""

    id: int
    name: str
    src: FlowEnd
    dst: FlowEnd
    category: str = "activation"
    args: Mapping[str, Any] = field(default_factory=dict, hash=False)


def chrome_trace(
    spans: Iterable[Span],
    flows: Iterable[Flow] = (),
    *,
    node_names: Mapping[int, str] | None = None,
    device_names: Mapping[int, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The trace as a JSON-ready dict. Processes and threads are named ``node N`` and
    ``device D`` unless named otherwise, and sorted by number so Perfetto shows them in order."""
    spans = list(spans)
    events: list[dict[str, Any]] = []
    threads = sorted({(s.node, s.device) for s in spans})
    for node in sorted({n for n, _ in threads}):
        name = (node_names or {}).get(node, f"node {node}")
        events.append(_meta("process_name", node, 0, {"name": name}))
        events.append(_meta("process_sort_index", node, 0, {"sort_index": node}))
    for node, device in threads:
        name = (device_names or {}).get(device, f"device {device}")
        events.append(_meta("thread_name", node, device, {"name": name}))
        events.append(_meta("thread_sort_index", node, device, {"sort_index": device}))
    for s in sorted(spans, key=lambda s: (s.start_s, s.node, s.device)):
        events.append(
            {
                "name": s.name,
                "cat": s.category,
                "ph": "X",
                "ts": s.start_s * US,
                "dur": s.duration_s * US,
                "pid": s.node,
                "tid": s.device,
                "args": dict(s.args),
            }
        )
    for f in flows:
        common = {"name": f.name, "cat": f.category, "id": f.id}
        events.append(
            {
                **common,
                "ph": "s",
                "ts": f.src.at_s * US,
                "pid": f.src.node,
                "tid": f.src.device,
                "args": dict(f.args),
            }
        )
        events.append(
            {
                **common,
                "ph": "f",
                "bp": "e",
                "ts": f.dst.at_s * US,
                "pid": f.dst.node,
                "tid": f.dst.device,
                "args": dict(f.args),
            }
        )
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if metadata:
        out["metadata"] = dict(metadata)
    return out


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def write_trace(path: str | os.PathLike[str], trace: Mapping[str, Any]) -> None:
    """Write atomically, compact (traces of long runs get large)."""
    write_atomic(Path(path), json.dumps(trace, separators=(",", ":")) + "\n")


def _inside(start_s: float, duration_s: float, at_end: bool) -> float:
    """A time strictly inside a span, near its end or its start, for a flow to bind to it."""
    nudge = min(1e-6, duration_s / 2)
    return start_s + duration_s - nudge if at_end else start_s + nudge


def plan_spans(plan: Plan) -> tuple[list[Span], list[Flow]]:
    """A predicted plan as spans (one per entry per device, plus the transfer and gradient-sync
    time the plan adds after its waves) and flows (activations crossing device groups, from the
    producer's last entry to the consumer's first)."""
    per_node = plan.cluster.devices_per_node
    placed = placed_entries(plan)
    spans = []
    for p in placed:
        e = p.entry
        args = {
            "metaop": p.op.id,
            "task": p.op.task,
            "module": p.op.module,
            "layers": [e.first, e.end],
            "wave": p.wave,
            "devices": len(e.devices),
            "predicted_s": e.time_s,
            **({"dp_x_tp": plan.layout_text(e)} if plan.layout_text(e) else {}),
        }
        for d in e.devices:
            spans.append(Span(d // per_node, d, p.label, p.start_s, e.time_s, p.op.task, args))
    tail = overhead(plan)
    if tail is not None:  # predicted time after the waves, so the trace lasts iteration_s
        for d in range(plan.cluster.devices):
            spans.append(
                Span(
                    d // per_node,
                    d,
                    tail.label,
                    tail.start_s,
                    tail.duration_s,
                    "overhead",
                    {"breakdown": dict(plan.breakdown), "predicted_s": tail.duration_s},
                )
            )
    flows = []
    for i, f in enumerate(activation_flows(plan, placed)):
        src_dev, dst_dev = f.src.entry.devices[0], f.dst.entry.devices[0]
        flows.append(
            Flow(
                i + 1,
                "activations",
                FlowEnd(
                    src_dev // per_node, src_dev, _inside(f.src.start_s, f.src.entry.time_s, True)
                ),
                FlowEnd(
                    dst_dev // per_node, dst_dev, _inside(f.dst.start_s, f.dst.entry.time_s, False)
                ),
                args={"from": f.src.label, "to": f.dst.label, "kind": f.kind},
            )
        )
    return spans, flows


def plan_trace(plan: Plan) -> dict[str, Any]:
    """The predicted trace of a plan, with the plan's headline figures as metadata."""
    spans, flows = plan_spans(plan)
    return chrome_trace(
        spans,
        flows,
        metadata={
            "source": "spindle-dsl predicted plan",
            "spec": plan.spec.path,
            "devices": plan.cluster.devices,
            "device": plan.cluster.device,
            "iteration_s": plan.iteration_s,
        },
    )


def check_trace(trace: Mapping[str, Any]) -> list[str]:
    """Problems with a trace (empty when valid): required fields per phase, non-negative times,
    one thread name per (pid, tid), every flow id once as "s" and once as "f", and each flow end
    lying inside a complete event on its thread."""
    problems: list[str] = []
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    names: dict[tuple[int, int], int] = {}
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    starts: dict[Any, list[dict[str, Any]]] = {}
    finishes: dict[Any, list[dict[str, Any]]] = {}
    for k, ev in enumerate(events):
        ph = ev.get("ph")
        need: Sequence[str] = {
            "X": ("name", "ts", "dur", "pid", "tid"),
            "M": ("name", "pid", "args"),
            "s": ("name", "cat", "id", "ts", "pid", "tid"),
            "f": ("name", "cat", "id", "ts", "pid", "tid"),
        }.get(ph, ())
        if not need:
            problems.append(f"event {k}: unexpected phase {ph!r}")
            continue
        missing = [f for f in need if f not in ev]
        if missing:
            problems.append(f"event {k} ({ph}): missing {', '.join(missing)}")
            continue
        if ph == "X":
            if ev["ts"] < 0 or ev["dur"] < 0:
                problems.append(f"event {k}: negative time")
            slices.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
        elif ph == "M" and ev["name"] == "thread_name":
            key = (ev["pid"], ev["tid"])
            names[key] = names.get(key, 0) + 1
        elif ph == "s":
            starts.setdefault(ev["id"], []).append(ev)
        elif ph == "f":
            finishes.setdefault(ev["id"], []).append(ev)
    for key, count in names.items():
        if count != 1:
            problems.append(f"thread {key} named {count} times")
    for key in slices:
        if key not in names:
            problems.append(f"thread {key} has events but no thread_name")
    for fid in sorted(set(starts) | set(finishes), key=str):
        s, f = starts.get(fid, []), finishes.get(fid, [])
        if len(s) != 1 or len(f) != 1:
            problems.append(f"flow {fid}: {len(s)} start(s) and {len(f)} finish(es)")
            continue
        if s[0]["ts"] > f[0]["ts"]:
            problems.append(f"flow {fid} finishes before it starts")
        for ev in (s[0], f[0]):
            spans = slices.get((ev["pid"], ev["tid"]), [])
            if not any(a <= ev["ts"] <= b for a, b in spans):
                problems.append(f"flow {fid} {ev['ph']} at {ev['ts']} lies in no slice")
    return problems
