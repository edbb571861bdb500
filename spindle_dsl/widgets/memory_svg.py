"""Predicted peak memory per device as a small SVG bar chart, drawn without any dependency.

The widget redraws this on every slider move, so it must cost microseconds, not the hundreds
of milliseconds a plotting library spends starting a figure; a bar per device against one
capacity line is all a reader needs to see which devices are full.
"""

from __future__ import annotations

from html import escape

from spindle_dsl.plan.model import Plan

WIDTH = 640
HEIGHT = 180
LEFT = 56  # room for the axis labels
BOTTOM = 22
TOP = 12
OK_FILL = "#4e79a7"
OVER_FILL = "#e15759"


def gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def memory_svg(plan: Plan) -> str:
    """Bars of ``plan.memory_bytes`` (one per device id) under the device capacity line."""
    used = plan.memory_bytes
    cap = plan.cluster.memory_bytes
    if not used:
        return "<i>this plan does not predict memory per device</i>"
    top = max(max(used), cap) * 1.08 or 1.0
    plot_w = WIDTH - LEFT - 8
    plot_h = HEIGHT - TOP - BOTTOM
    slot = plot_w / len(used)
    bar = max(slot * 0.8, 1.0)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="10">',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 8}" y2="{TOP + plot_h}" '
        'stroke="#888"/>',
    ]
    for i, b in enumerate(used):
        x = LEFT + i * slot + (slot - bar) / 2
        fill = OVER_FILL if b > cap else OK_FILL
        parts.append(
            f'<rect x="{x:.1f}" y="{y(b):.1f}" width="{bar:.1f}" '
            f'height="{TOP + plot_h - y(b):.1f}" fill="{fill}">'
            f"<title>device {i}: {escape(gib(b))}</title></rect>"
        )
    parts.append(
        f'<line x1="{LEFT}" y1="{y(cap):.1f}" x2="{WIDTH - 8}" y2="{y(cap):.1f}" '
        'stroke="#c00" stroke-dasharray="4 3"/>'
    )
    parts.append(
        f'<text x="{LEFT - 4}" y="{y(cap) + 3:.1f}" text-anchor="end" fill="#c00">'
        f"{escape(gib(cap))}</text>"
    )
    parts.append(f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end">0</text>')
    step = max(1, len(used) // 16)
    for i in range(0, len(used), step):
        parts.append(
            f'<text x="{LEFT + (i + 0.5) * slot:.1f}" y="{HEIGHT - 6}" '
            f'text-anchor="middle">{i}</text>'
        )
    parts.append(
        f'<text x="{WIDTH - 8}" y="{TOP}" text-anchor="end" fill="#555">'
        f"peak {escape(gib(max(used)))} · device id below</text>"
    )
    parts.append("</svg>")
    return "".join(parts)
