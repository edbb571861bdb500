"""One measured step drawn like the predicted timeline, to lie under it in the report.

Devices down, time across, one bar per span of a measured trace (``spindle train --trace``):
forward in the task's colour, backward in a lighter shade of it, and the step's other work
(exchange, loss, gradient reduction, optimizer) in greys. The step shown is the one whose
length is the median of the kept steps (``render.measured``), from the moment its first rank
started it. Drawn with matplotlib's object API, as ``render.timeline``.
"""

from __future__ import annotations

import io
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spindle_dsl.plan.model import Plan
from spindle_dsl.render.colors import Palette, mix
from spindle_dsl.render.fmt import time_unit
from spindle_dsl.render.schedule import plan_palette

OTHER = {
    "exchange": ("#7f7f7f", "exchange"),
    "loss": ("#3b3b3b", "loss"),
    "reduce": ("#9a8fb5", "gradient reduction"),
    "optimizer": ("#b5a48f", "optimizer"),
}
WIDTH_IN, DPI = 13.0, 110


@dataclass(frozen=True)
class StepSpan:
    device: int
    category: str
    start_s: float  # from the step's start on its earliest rank
    duration_s: float
    metaop: str | None


def median_step(trace: Mapping[str, Any]) -> int | None:
    """The kept step (after the first) whose slowest rank took the median time."""
    lengths: dict[int, float] = {}
    for e in trace.get("traceEvents", []):
        m = re.fullmatch(r"step (\d+)", str(e.get("name", "")))
        if e.get("ph") == "X" and e.get("cat") == "step" and m:
            k = int(m.group(1))
            lengths[k] = max(lengths.get(k, 0.0), e["dur"])
    kept = sorted(lengths)[1:] or sorted(lengths)
    if not kept:
        return None
    mid = statistics.median_low([lengths[k] for k in kept])
    return next(k for k in kept if lengths[k] == mid)


def step_spans(trace: Mapping[str, Any], step: int) -> list[StepSpan]:
    """Every span of ``step`` on every rank, timed from the step's earliest start."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    windows = {
        e["tid"]: (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "step" and e.get("name") == f"step {step}"
    }
    if not windows:
        return []
    t0 = min(a for a, _ in windows.values())
    out = []
    for e in events:
        w = windows.get(e["tid"])
        if e.get("cat") == "step" or w is None or not w[0] <= e["ts"] + e["dur"] / 2 <= w[1]:
            continue
        metaop = (e.get("args") or {}).get("metaop")
        out.append(
            StepSpan(e["tid"], str(e.get("cat")), (e["ts"] - t0) / 1e6, e["dur"] / 1e6, metaop)
        )
    return out


def measured_timeline_figure(
    plan: Plan, trace: Mapping[str, Any], colours: Palette | None = None, total_s: float = 0.0
):  # -> matplotlib Figure
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    colours = colours or plan_palette(plan)
    step = median_step(trace)
    spans = step_spans(trace, step) if step is not None else []
    devices = max([plan.cluster.devices, *(s.device + 1 for s in spans)])
    end = max([total_s, *(s.start_s + s.duration_s for s in spans), 1e-12])
    scale, unit = time_unit(end)
    height = min(2.2 + devices * 0.32, 18.0)
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_xlim(0, end * scale)
    ax.set_ylim(devices, 0)
    task_of = {m.id: m.task for m in plan.metaops}
    for s in spans:
        if s.category in ("forward", "backward") and s.metaop in task_of:
            base = colours[task_of[s.metaop]].base
            fill = base if s.category == "forward" else mix(base, "#ffffff", 0.45)
        else:
            fill = OTHER.get(s.category, ("#cccccc", ""))[0]
        ax.add_patch(
            Rectangle(
                (s.start_s * scale, s.device + 0.06),
                max(s.duration_s * scale, 1e-9),
                0.88,
                facecolor=fill,
                edgecolor="white",
                linewidth=0.4,
            )
        )
    ax.set_yticks([d + 0.5 for d in range(devices)], [f"rank {d}" for d in range(devices)])
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel(f"time ({unit})")
    title = f"measured step {step}" if step is not None else "no measured step in the trace"
    ax.set_title(f"{title} (forward: task colour, backward: lighter)", fontsize=10)
    handles = [Patch(facecolor=c.base, label=c.task) for c in colours.colours]
    handles += [Patch(facecolor=col, label=label) for col, label in OTHER.values()]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 8),
               fontsize=8, frameon=False)  # fmt: skip
    return fig


def measured_timeline_bytes(
    plan: Plan,
    trace: Mapping[str, Any],
    fmt: str = "svg",
    colours: Palette | None = None,
    total_s: float = 0.0,
) -> bytes:
    """The measured step as SVG (or PNG/PDF) bytes, its time axis at least ``total_s`` long
    (pass the predicted iteration to draw both on one scale)."""
    import matplotlib

    fig = measured_timeline_figure(plan, trace, colours, total_s)
    buf = io.BytesIO()
    meta = {"Date": None} if fmt == "svg" else {}
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "spindle"}):
        fig.savefig(buf, format=fmt, metadata=meta)
    return buf.getvalue()
