"""The pictures as plain text, for a terminal or a log: no Graphviz, no matplotlib.

``spindle render --format txt`` prints these. The timeline is a character grid (a letter per
MetaOp, ``.`` for idle) with devices that do exactly the same thing merged into one row, so a
64-device plan still fits a screen.
"""

from __future__ import annotations

import string

from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan
from spindle_dsl.render.dot_metagraph import graph_view
from spindle_dsl.render.dot_waves import plan_title
from spindle_dsl.render.fmt import device_ranges, fmt_flops, fmt_seconds
from spindle_dsl.render.schedule import overhead, placed_entries

SYMBOLS = string.ascii_uppercase + string.ascii_lowercase + string.digits


def metagraph_text(source: MetaGraph | Plan) -> str:
    """One block per task, one line per MetaOp, with what the picture's labels say."""
    view = graph_view(source)
    shared = {i: s.module for s in view.shared for i in s.metaops}
    lines = [view.title]
    for task, caption in view.tasks:
        lines.append(f"task {task}" + (f"  ({caption})" if caption else ""))
        for op in view.ops:
            if op.task != task:
                continue
            tags = (["frozen"] if op.frozen else []) + (
                [f"shares {shared[op.id]}"] if op.id in shared else []
            )
            inputs = [f"{m}[{t}]" for m, t in op.modalities] + list(op.deps)
            lines.append(
                f"  {op.module:<16} {op.kind:<12} L={op.layers:<4} {op.batch} x {op.tokens} tok"
                f"  fwd {fmt_flops(op.forward_flops)}"
                + (f"  [{', '.join(tags)}]" if tags else "")
                + (f"  <- {', '.join(inputs)}" if inputs else "")
            )
    return "\n".join(lines) + "\n"


def waves_text(plan: Plan) -> str:
    """The wave table: one line per entry under a line per wave."""
    lines = [plan_title(plan)]
    for w in sorted(plan.waves, key=lambda w: w.index):
        lines.append(
            f"wave {w.index}  start {fmt_seconds(w.start_s)}  length {fmt_seconds(w.duration_s)}"
        )
        for e in w.entries:
            lines.append(
                f"  {e.metaop:<32} layers [{e.first},{e.end})  devices "
                f"{device_ranges(e.devices)} ({len(e.devices)})  {fmt_seconds(e.time_s)}"
                + (f"  dp x tp {plan.layout_text(e)}" if plan.layout_text(e) else "")
            )
    return "\n".join(lines) + "\n"


def timeline_text(plan: Plan, width: int = 100) -> str:
    """Devices down, time across; each column is ``iteration / width`` seconds."""
    placed = placed_entries(plan)
    symbol = {m.id: SYMBOLS[i % len(SYMBOLS)] for i, m in enumerate(plan.metaops)}
    total = max(sum(w.duration_s for w in plan.waves), plan.iteration_s, 1e-12)
    step = total / width
    tail = overhead(plan)
    tail_from = round(tail.start_s / step) if tail else width
    rows = []
    for d in range(plan.cluster.devices):
        cells = ["."] * tail_from + ["~"] * (width - tail_from)
        for p in placed:
            if d in p.entry.devices:
                a = round(p.start_s / step)
                b = max(a + 1, round(p.end_s / step))
                for c in range(a, min(b, width)):
                    cells[c] = symbol[p.op.id]
        rows.append("".join(cells))
    marks = [" "] * width
    for w in plan.waves:
        c = round(w.start_s / step)
        if c < width:
            marks[c] = "|"
    merged: list[tuple[list[int], str]] = []
    for d, row in enumerate(rows):
        if merged and merged[-1][1] == row and merged[-1][0][-1] == d - 1:
            merged[-1][0].append(d)
        else:
            merged.append(([d], row))
    label_w = max(len(f"dev {device_ranges(ds)}") for ds, _ in merged)
    out = [plan_title(plan), f"{'waves':<{label_w}} {''.join(marks)}"]
    out += [f"{'dev ' + device_ranges(ds):<{label_w}} {row}" for ds, row in merged]
    key = f"one column = {fmt_seconds(step)}; '.' = idle"
    out.append(f"{'':<{label_w}} {key}" + (f"; '~' = {tail.label}" if tail else ""))
    used = {p.op.id for p in placed}
    out += [f"  {symbol[m.id]} {m.id}" for m in plan.metaops if m.id in used]
    return "\n".join(out) + "\n"
