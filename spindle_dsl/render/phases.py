"""The phases of a schedule on one timeline of training steps, as hand-written SVG.

A schedule's plans each describe one training step; what a reader of a scheduled run needs
besides is when each applies. The picture puts training steps across, a band per phase on
top (its mix, predicted step time and speed-up over the sequential baseline), and a row per
task below with its batch in each phase, in the task's colour, so a task that leaves and
comes back is visible at a glance. The last phase runs to the end of training, whose step the
schedule does not know: it is drawn as long as the longest phase before it, open at the end.
Both the HTML report and the planner widget draw it; plain SVG keeps it cheap to redraw.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from html import escape

from spindle_dsl.plan.bundle import PlanBundle
from spindle_dsl.render.colors import Palette, palette, task_order
from spindle_dsl.render.fmt import fmt_seconds

WIDTH = 760
LEFT = 96  # task names
RIGHT = 18
TOP = 6
BAND = 38  # the phases' band
ROW = 22  # a task's row
AXIS = 30


@dataclass(frozen=True)
class PhaseBar:
    """What the picture shows of one phase."""

    first_step: int
    mix: str
    iteration_s: float
    speedup: float | None  # over the sequential baseline
    batches: tuple[tuple[str, int], ...]  # the tasks it trains, with their batches


def phase_bars(bundle: PlanBundle) -> tuple[PhaseBar, ...]:
    bars = []
    for p in bundle.phases:
        seq = dict(p.plan.baselines).get("sequential_s")
        batches = tuple(dict((m.task, m.batch) for m in p.plan.metaops).items())
        speedup = seq / p.plan.iteration_s if seq and p.plan.iteration_s > 0 else None
        bars.append(PhaseBar(p.first_step, p.mix, p.plan.iteration_s, speedup, batches))
    return tuple(bars)


def bundle_palette(bundle: PlanBundle) -> Palette:
    """Task colours shared by every phase's pictures (a task keeps its colour throughout)."""
    return palette(task_order(m.task for p in bundle.phases for m in p.plan.metaops))


def phases_svg(bundle: PlanBundle, colours: Palette | None = None) -> str:
    colours = colours or bundle_palette(bundle)
    bars = phase_bars(bundle)
    tasks = colours.tasks
    starts = [b.first_step for b in bars]
    lengths = [b - a for a, b in itertools.pairwise(starts)]
    tail = max([*lengths, 1])
    span = starts[-1] + tail
    plot_w = WIDTH - LEFT - RIGHT
    height = TOP + BAND + ROW * len(tasks) + AXIS

    def x(step: float) -> float:
        return LEFT + plot_w * step / span

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="10">'
    ]
    for i, bar in enumerate(bars):
        x0 = x(bar.first_step)
        x1 = x(starts[i + 1]) if i + 1 < len(bars) else x(span)
        w = max(x1 - x0, 1.0)
        fill = "#f2f2f2" if i % 2 == 0 else "#e6e6e6"
        speed = f" · {bar.speedup:.2f}× seq." if bar.speedup else ""
        tip = escape(f"phase {i + 1}: mix {bar.mix} from step {bar.first_step}")
        out.append(
            f'<g><title>{tip}</title><rect x="{x0:.1f}" y="{TOP}" width="{w:.1f}" '
            f'height="{BAND - 2}" fill="{fill}"/>'
            f'<text x="{x0 + 4:.1f}" y="{TOP + 14}" font-weight="bold">{escape(bar.mix)}</text>'
            f'<text x="{x0 + 4:.1f}" y="{TOP + 28}" fill="#444">'
            f"{escape(fmt_seconds(bar.iteration_s))}/step{escape(speed)}</text></g>"
        )
        batches = dict(bar.batches)
        for r, task in enumerate(tasks):
            y = TOP + BAND + r * ROW
            if batches.get(task, 0) <= 0:
                continue
            c = colours[task]
            out.append(
                f'<rect x="{x0 + 1:.1f}" y="{y + 2}" width="{max(w - 2, 0.5):.1f}" '
                f'height="{ROW - 4}" fill="{c.base}"><title>{escape(task)}: batch '
                f"{batches[task]} in phase {i + 1}</title></rect>"
                f'<text x="{x0 + 5:.1f}" y="{y + ROW / 2 + 4:.1f}" fill="{c.text}">'
                f"batch {batches[task]}</text>"
            )
    for r, task in enumerate(tasks):
        y = TOP + BAND + r * ROW + ROW / 2 + 4
        out.append(f'<text x="{LEFT - 6}" y="{y:.1f}" text-anchor="end">{escape(task)}</text>')
    axis = TOP + BAND + ROW * len(tasks)
    out.append(
        f'<line x1="{LEFT}" y1="{axis + 1}" x2="{x(span):.1f}" y2="{axis + 1}" stroke="#333"/>'
    )
    for s in starts:
        out.append(
            f'<line x1="{x(s):.1f}" y1="{TOP}" x2="{x(s):.1f}" y2="{axis + 4}" stroke="#333" '
            f'stroke-width="0.6" stroke-dasharray="2 2"/>'
            f'<text x="{x(s):.1f}" y="{axis + 14}" text-anchor="middle">{s}</text>'
        )
    out.append(
        f'<text x="{x(span) - 2:.1f}" y="{axis + 14}" text-anchor="end" fill="#555">→ end</text>'
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{axis + 27}" text-anchor="middle" fill="#555">'
        "training steps (completed optimizer steps, as in the schedule block)</text>"
    )
    out.append("</svg>")
    return "".join(out)
