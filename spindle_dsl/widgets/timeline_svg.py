"""A plan's timeline as hand-written SVG: devices down, time across, one bar per entry.

``spindle_dsl.render.timeline`` draws the publication-quality timeline with matplotlib, which
costs a good part of a second per figure on a laptop CPU (``bench/render_bench.py`` times it);
the widget redraws on every slider move and must stay under half a second in all, so it draws
this lighter version instead. It takes its facts (entry start times) and its colours from
``spindle_dsl.render`` so both timelines agree.
"""

from __future__ import annotations

from html import escape

from spindle_dsl.plan.model import Plan
from spindle_dsl.render.colors import IDLE_FILL, Palette
from spindle_dsl.render.fmt import device_runs, fmt_seconds, time_unit
from spindle_dsl.render.schedule import placed_entries, plan_palette

WIDTH = 760
LEFT = 44  # device labels
RIGHT = 10
TOP = 8
AXIS = 30  # time axis and its label
LEGEND_ROW = 16


def _row_height(devices: int) -> float:
    """Rows shrink as devices grow so the picture stays between ~120 and ~420 px tall."""
    return max(4.0, min(18.0, 400.0 / devices))


def timeline_svg(plan: Plan, colours: Palette | None = None) -> str:
    colours = colours or plan_palette(plan)
    n = plan.cluster.devices
    row = _row_height(n)
    span = max(plan.iteration_s, sum(w.duration_s for w in plan.waves), 1e-12)
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = row * n
    per_line = max(1, plot_w // 150)
    legend_rows = -(-len(colours.colours) // per_line)
    height = TOP + plot_h + AXIS + LEGEND_ROW * legend_rows + 4

    def x(t: float) -> float:
        return LEFT + plot_w * t / span

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="sans-serif" font-size="10">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h:.1f}" fill="{IDLE_FILL}"/>',
    ]
    for p in placed_entries(plan):
        fill = colours[p.op.task].base
        tip = escape(f"{p.label} on {len(p.entry.devices)} devices: {fmt_seconds(p.entry.time_s)}")
        for first, count in device_runs(p.entry.devices):
            parts.append(
                f'<rect x="{x(p.start_s):.2f}" y="{TOP + first * row:.2f}" '
                f'width="{max(x(p.end_s) - x(p.start_s), 0.5):.2f}" height="{count * row:.2f}" '
                f'fill="{fill}" stroke="#fff" stroke-width="0.5"><title>{tip}</title></rect>'
            )
    for w in plan.waves:
        parts.append(
            f'<line x1="{x(w.start_s):.2f}" y1="{TOP}" x2="{x(w.start_s):.2f}" '
            f'y2="{TOP + plot_h:.1f}" stroke="#333" stroke-width="0.6" stroke-dasharray="2 2"/>'
        )
    label_every = max(1, int(12 / row))
    for d in range(0, n, label_every):
        parts.append(
            f'<text x="{LEFT - 4}" y="{TOP + (d + 0.5) * row + 3:.1f}" text-anchor="end">{d}</text>'
        )
    scale, unit = time_unit(span)
    axis_y = TOP + plot_h
    for i in range(6):
        t = span * i / 5
        parts.append(
            f'<text x="{x(t):.1f}" y="{axis_y + 12:.1f}" text-anchor="middle">'
            f"{t * scale:.3g}</text>"
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{axis_y + 24:.1f}" text-anchor="middle" '
        f'fill="#555">time ({unit}) · device id down · dashed lines start waves</text>'
    )
    for i, c in enumerate(colours.colours):
        lx = LEFT + (i % per_line) * 150
        ly = axis_y + AXIS + (i // per_line) * LEGEND_ROW
        parts.append(f'<rect x="{lx}" y="{ly:.1f}" width="10" height="10" fill="{c.base}"/>')
        parts.append(f'<text x="{lx + 14}" y="{ly + 9:.1f}">{escape(c.task)}</text>')
    parts.append("</svg>")
    return "".join(parts)
