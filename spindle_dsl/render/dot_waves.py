"""The wave plan as a Graphviz picture: waves top to bottom, their entries side by side.

Each wave is a box titled with its index, start and length; inside, one node per entry with its
MetaOp, layer range, devices and predicted time, filled in its task's colour, and a grey node for
the devices the wave leaves idle. Solid grey arrows are activations that cross device groups
(the same flows the Chrome trace draws); dashed arrows in the task colour join the layer ranges
of a MetaOp split across waves.
"""

from __future__ import annotations

import itertools
from html import escape

import graphviz

from spindle_dsl.plan.model import Plan
from spindle_dsl.render.colors import IDLE_FILL, Palette
from spindle_dsl.render.fmt import device_ranges, fmt_seconds
from spindle_dsl.render.schedule import Placed, activation_flows, placed_entries, plan_palette

FONT = "Helvetica"


def _node_id(p: Placed) -> str:
    return f"w{p.wave}/{p.op.id}"


def _entry_label(p: Placed) -> str:
    e = p.entry
    rows = [
        f"<b>{escape(p.op.id)}</b>",
        f"layers {e.first}-{e.end} of {p.op.layers}",
        f"devices {escape(device_ranges(e.devices))} ({len(e.devices)})",
        fmt_seconds(e.time_s),
    ]
    dp, tp = p.op.layout_at(len(e.devices))
    if tp > 1:
        rows.insert(3, f"{dp} x {tp}-way tensor parallel")
    return "<" + "<br/>".join(rows) + ">"


def plan_title(plan: Plan) -> str:
    """One line that says what the plan is and how good it is."""
    c = plan.cluster
    parts = [
        f"{plan.spec.path}",
        f"{c.devices} × {c.device}",
        f"iteration {fmt_seconds(plan.iteration_s)}",
        f"lower bound {fmt_seconds(plan.lower_bound_s)}",
    ]
    seq = dict(plan.baselines).get("sequential_s")
    if seq:
        parts.append(f"{seq / plan.iteration_s:.2f}× vs sequential")
    return " · ".join(parts)


def waves_dot(plan: Plan, colours: Palette | None = None) -> graphviz.Digraph:
    """The picture's DOT graph. ``colours`` defaults to the plan's task order."""
    colours = colours or plan_palette(plan)
    placed = placed_entries(plan)
    dot = graphviz.Digraph("waves")
    dot.attr(
        rankdir="TB",
        newrank="true",
        fontname=FONT,
        label=escape(plan_title(plan)),
        labelloc="t",
        fontsize="16",
        nodesep="0.25",
        ranksep="0.45",
    )
    dot.attr("node", fontname=FONT, fontsize="11", shape="box", style="rounded,filled")
    dot.attr("edge", fontname=FONT, fontsize="9")
    anchors: list[str] = []
    for wave in sorted(plan.waves, key=lambda w: w.index):
        mine = [p for p in placed if p.wave == wave.index]
        with dot.subgraph(name=f"cluster_wave_{wave.index}") as sub:
            sub.attr(
                label=(
                    f"<<b>wave {wave.index}</b>  start {escape(fmt_seconds(wave.start_s))}"
                    f" · {escape(fmt_seconds(wave.duration_s))}>"
                ),
                labeljust="l",
                style="rounded",
                color="#888888",
                rank="same",
            )
            ids = []
            for p in mine:
                col = colours[p.op.task]
                sub.node(
                    _node_id(p),
                    _entry_label(p),
                    fillcolor=col.light,
                    color=col.base,
                    penwidth="2",
                    tooltip=p.label,
                )
                ids.append(_node_id(p))
            used = {d for p in mine for d in p.entry.devices}
            idle = [d for d in range(plan.cluster.devices) if d not in used]
            if idle or not mine:
                sub.node(
                    f"w{wave.index}/idle",
                    f"<idle<br/>devices {escape(device_ranges(idle))} ({len(idle)})>",
                    fillcolor=IDLE_FILL,
                    color="#aaaaaa",
                    fontcolor="#666666",
                    style="rounded,filled,dashed",
                )
                ids.append(f"w{wave.index}/idle")
            for a, b in itertools.pairwise(ids):  # keep the entries in plan order
                sub.edge(a, b, style="invis")
            anchors.append(ids[0])
    for a, b in itertools.pairwise(anchors):
        dot.edge(a, b, style="invis", weight="10")
    for f in activation_flows(plan, placed):
        if f.kind == "layers":
            col = colours[f.src.op.task]
            dot.edge(_node_id(f.src), _node_id(f.dst), style="dashed", color=col.base)
        else:
            dot.edge(_node_id(f.src), _node_id(f.dst), color="#777777")
    return dot
