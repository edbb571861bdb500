"""One self-contained HTML page about a plan: summary, pictures, wave table, baselines, memory.

For a schedule of mixes (a plan bundle) the page starts with the phases on one timeline of
training steps and a table of them, then shows each phase's plan as it would show one plan.

Self-contained means it opens from an e-mail attachment on a machine without network: pictures
are embedded as ``data:`` URIs (each SVG stays its own document, so the ids matplotlib and
Graphviz write cannot collide), the CSS is inline, and there is no script and no external URL.
Without the ``dot`` program the two Graphviz pictures are replaced by a note saying how to
install it and by their DOT source, and the rest of the page is unchanged.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

from spindle_dsl import __version__
from spindle_dsl.atomic import write_atomic
from spindle_dsl.errors import SpindleError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.bundle import PlanBundle
from spindle_dsl.plan.model import Plan
from spindle_dsl.render.colors import Palette
from spindle_dsl.render.dot_metagraph import metagraph_dot
from spindle_dsl.render.dot_waves import waves_dot
from spindle_dsl.render.fmt import device_ranges, fmt_bytes, fmt_seconds
from spindle_dsl.render.gap import gap_text
from spindle_dsl.render.graphviz_tools import INSTALL_HINT, dot_available, render_dot
from spindle_dsl.render.memory import levers_text, memory_levers, memory_summary, memory_svg
from spindle_dsl.render.phases import bundle_palette, phase_bars, phases_svg
from spindle_dsl.render.schedule import plan_palette
from spindle_dsl.render.timeline import timeline_bytes

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 24px auto; max-width: 1320px; color: #222; line-height: 1.4; padding: 0 16px; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid
#ddd; padding-bottom: 4px; } .sub { color: #666; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.card { border: 1px solid #ddd; border-radius: 8px; padding: 10px 14px; min-width: 140px; }
.card b { display: block; font-size: 1.35em; } .card span { color: #666; font-size: 0.85em; }
figure { margin: 12px 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 8px 0; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 3px 10px; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.sw { display: inline-block; width: 0.9em; height: 0.9em; border-radius: 2px;
      vertical-align: -0.1em; margin-right: 6px; }
.notice { background: #fff4e5; border: 1px solid #f0b36b; border-radius: 6px; padding: 8px 12px; }
pre { background: #f7f7f7; padding: 8px; overflow-x: auto; font-size: 0.8em; }
.legend span { margin-right: 16px; } footer { color: #888; font-size: 0.8em; margin-top: 3em; }
"""


@dataclass(frozen=True)
class Report:
    """The page and what could not be drawn (one line each, for the command to print)."""

    html: str
    warnings: tuple[str, ...]


def _img(data: bytes, mime: str, alt: str) -> str:
    b64 = base64.b64encode(data).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:{mime};base64,{b64}">'


def _figure(title: str, body: str, caption: str) -> str:
    return (
        f'<figure id="{escape(title.lower().replace(" ", "-"))}">{body}'
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )


def _dot_picture(graph, title: str, caption: str, warnings: list[str]) -> str:
    if dot_available():
        return _figure(
            title, _img(render_dot(graph, "svg", title), "image/svg+xml", title), caption
        )
    warnings.append(f"{title}: Graphviz `dot` is not installed; the report shows its DOT source")
    return (
        f'<div class="notice"><b>{escape(title)}</b> needs the Graphviz <code>dot</code> '
        f"program, which is not installed. {escape(INSTALL_HINT)}.</div>"
        f"<details><summary>DOT source of the {escape(title.lower())}</summary>"
        f"<pre>{escape(graph.source)}</pre></details>"
    )


def _cards(plan: Plan) -> str:
    seq = dict(plan.baselines).get("sequential_s")
    lp = (plan.extra.get("bounds") or {}).get("lp_s") is not None  # else: area bound only
    over_lp = plan.over_lp()
    cards = [
        (fmt_seconds(plan.iteration_s), "predicted iteration"),
        (fmt_seconds(plan.lower_bound_s), "LP lower bound" if lp else "lower bound"),
        (
            f"{plan.iteration_s / plan.lower_bound_s:.2f}×" if plan.lower_bound_s > 0 else "-",
            "iteration / LP bound" if lp else "of the lower bound",
        ),
        (f"{seq / plan.iteration_s:.2f}×" if seq else "-", "speed-up vs sequential"),
        (levers_text(plan), "memory levers"),
        (
            f"{max(plan.memory_bytes) / plan.cluster.memory_bytes:.0%}"
            if plan.memory_bytes
            else "-",
            "peak memory of capacity",
        ),
        (str(len(plan.waves)), "waves (one pass)"),
        (
            f"{1 - plan.idle_share() if plan.waves else 0:.0%}",
            f"{'cores' if plan.lanes() < plan.cluster.devices else 'devices'} busy inside waves",
        ),
        *([(f"{over_lp[1]:.2f}×", "entries' device-seconds / LP bound's")] if over_lp else []),
        (f"{plan.cluster.devices} × {plan.cluster.device}", "devices"),
        (f"{plan.solver.name} ({plan.solver.status})", f"planned in {plan.solver.wall_s:.2f} s"),
    ]
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><b>{escape(v)}</b><span>{escape(k)}</span></div>' for v, k in cards
        )
        + "</div>"
    )


def _wave_table(plan: Plan, colours: Palette) -> str:
    rows = []
    for w in sorted(plan.waves, key=lambda w: w.index):
        for k, e in enumerate(w.entries):
            col = colours[plan.metaop(e.metaop).task]
            head = (
                f'<td rowspan="{len(w.entries)}">{w.index}</td>'
                f'<td class="num" rowspan="{len(w.entries)}">{escape(fmt_seconds(w.start_s))}</td>'
                f'<td class="num" rowspan="{len(w.entries)}">{escape(fmt_seconds(w.duration_s))}'
                "</td>"
                if k == 0
                else ""
            )
            rows.append(
                f"<tr>{head}<td><span class='sw' style='background:{col.base}'></span>"
                f"{escape(e.metaop)}</td><td>[{e.first}, {e.end})</td>"
                f"<td>{escape(device_ranges(e.devices))}</td><td class='num'>{len(e.devices)}"
                f"{escape(f' ({plan.layout_text(e)} dp x tp)' if plan.layout_text(e) else '')}</td>"
                f"<td class='num'>{escape(fmt_seconds(e.time_s))}</td></tr>"
            )
    return (
        "<table><tr><th>wave</th><th class='num'>start</th><th class='num'>length</th>"
        "<th>MetaOp</th><th>layers</th><th>devices</th><th class='num'>n</th>"
        "<th class='num'>time</th></tr>" + "".join(rows) + "</table>"
    )


def _baselines(plan: Plan) -> str:
    rows = [("this plan", plan.iteration_s), *plan.baselines]
    body = "".join(
        f"<tr><td>{escape(name.removesuffix('_s'))}</td>"
        f"<td class='num'>{escape(fmt_seconds(s))}</td>"
        f"<td class='num'>{s / plan.iteration_s:.2f}×</td></tr>"
        for name, s in rows
    )
    extra = "".join(
        f"<tr><td>{escape(k.removesuffix('_s'))}</td><td class='num'>{escape(fmt_seconds(v))}"
        "</td><td></td></tr>"
        for k, v in plan.breakdown
    )
    out = (
        "<table><tr><th>schedule</th><th class='num'>iteration</th>"
        "<th class='num'>relative to this plan</th></tr>" + body + "</table>"
    )
    if extra:
        out += "<h3>Where the time goes</h3><table>" + extra + "</table>"
    return out


def _memory(plan: Plan, warnings: list[str]) -> str:
    summary = memory_summary(plan)
    if summary is None:
        warnings.append("the plan records no memory figures")
        return "<p>The plan records no memory figures per device.</p>"
    svg = memory_svg(plan)
    assert svg is not None
    cap = summary["capacity"]
    over = [d for d, b in enumerate(plan.memory_bytes) if b > cap]
    notice = ""
    if over:
        warnings.append(f"{len(over)} devices exceed their memory")
        notice = (
            f'<div class="notice"><b>{len(over)} of {len(plan.memory_bytes)} devices exceed '
            f"their {escape(fmt_bytes(cap))}</b> (devices {escape(device_ranges(over))}): this "
            "plan does not fit as predicted.</div>"
        )
    table = (
        "<table>"
        + "".join(
            f"<tr><td>{k}</td><td class='num'>{escape(fmt_bytes(v))}</td>"
            f"<td class='num'>{'' if k == 'capacity' else f'{v / cap:.0%} of capacity'}</td></tr>"
            for k, v in summary.items()
        )
        + "</table>"
    )
    levers = (
        "<h3>Memory levers</h3><table>"
        + "".join(
            f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in memory_levers(plan)
        )
        + "</table>"
    )
    caption = (
        "Predicted peak per device (parameters, gradients, optimizer state, activations kept "
        "for backward by one micro-batch pass, the largest working set) against capacity."
    )
    figure = _figure("Memory", _img(svg, "image/svg+xml", "memory per device"), caption)
    return notice + levers + figure + table


def _measured(plan: Plan, trace: Mapping[str, Any], colours: Palette) -> tuple[str, float]:
    """The measured step under the prediction, on one time scale, and the largest misses."""
    from spindle_dsl.render.compare import compare
    from spindle_dsl.render.measured import read_measured
    from spindle_dsl.render.measured_timeline import measured_timeline_bytes

    run = read_measured(trace)
    total = max(plan.iteration_s, run.step_s)
    rows = compare(plan, run)
    body = "".join(
        f"<tr><td>{escape(r.kind)}</td><td>{escape(r.name)}</td>"
        f"<td class='num'>{escape(fmt_seconds(r.predicted_s))}</td>"
        f"<td class='num'>{escape(fmt_seconds(r.measured_s))}</td>"
        f"<td class='num'>{r.miss_s * 1e3:+.2f} ms</td></tr>"
        for r in rows[:16]
    )
    picture = _figure(
        "Measured step",
        _img(measured_timeline_bytes(plan, trace, "svg", colours, total), "image/svg+xml",
             "measured step"),
        f"A measured step (the median of steps {run.kept[0]}..{run.kept[-1]}) on the same time "
        "scale as the predicted timeline above.",
    )  # fmt: skip
    table = (
        "<table><tr><th></th><th>what</th><th class='num'>predicted</th>"
        "<th class='num'>measured</th><th class='num'>miss</th></tr>" + body + "</table>"
    )
    return picture + "<h3>Predicted against measured, largest miss first</h3>" + table, total


def _plan_body(
    plan: Plan,
    graph: MetaGraph | None,
    colours: Palette,
    warnings: list[str],
    level: int = 2,
    measured: Mapping[str, Any] | None = None,
) -> str:
    """Everything the page says about one plan, its headings at ``level``; ``measured`` (a
    measured trace of a run of it) adds a measured step under the predicted timeline."""
    legend = "".join(
        f"<span><span class='sw' style='background:{c.base}'></span>{escape(c.task)}</span>"
        for c in colours.colours
        if any(m.task == c.task for m in plan.metaops)
    )
    mg = _dot_picture(
        metagraph_dot(graph if graph is not None else plan, colours),
        "MetaGraph",
        "A cluster per task; double-bordered MetaOps linked by gold dashes share one module's "
        "parameters.",
        warnings,
    )
    wv = _dot_picture(
        waves_dot(plan, colours),
        "Wave plan",
        "Waves top to bottom; grey arrows are activations that cross device groups.",
        warnings,
    )
    measured_html, total = _measured(plan, measured, colours) if measured else ("", 0.0)
    tl = _figure(
        "Timeline",
        _img(timeline_bytes(plan, "svg", colours, total), "image/svg+xml", "timeline"),
        "Devices down, time across; hatched areas are idle devices.",
    )
    notes = "".join(f"<li>{escape(n)}</li>" for n in plan.notes)
    h = f"h{level}"
    gap = gap_text(dict(plan.gap_split() or ()))
    return f"""{_cards(plan)}
{f'<p class="sub">{escape(gap[0].upper() + gap[1:])}</p>' if gap else ""}
<p class="legend">{legend}</p>
{"<ul>" + notes + "</ul>" if notes else ""}
<{h}>MetaGraph</{h}>{mg}
<{h}>Timeline</{h}>{tl}{measured_html}
<{h}>Wave plan</{h}>{wv}
<{h}>Waves</{h}>{_wave_table(plan, colours)}
<{h}>Baselines</{h}>{_baselines(plan)}
<{h}>Memory per device</{h}>{_memory(plan, warnings)}"""


def _page(title: str, sub: str, body: str, sha256: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{CSS}</style></head><body>
<h1>{escape(title)}</h1>
<p class="sub">{sub}</p>
{body}
<footer>spindle-dsl {escape(__version__)} · spec sha256 {escape(sha256[:16])} ·
generated {stamp}</footer>
</body></html>
"""


def _cluster_line(plan: Plan) -> str:
    return (
        f"{plan.cluster.devices} × {escape(plan.cluster.device)} "
        f"({plan.cluster.devices_per_node} per node, "
        f"{escape(fmt_bytes(plan.cluster.memory_bytes))} each)"
    )


def build_report(
    plan: Plan, graph: MetaGraph | None = None, measured: Mapping[str, Any] | None = None
) -> Report:
    """The page for ``plan``; ``graph`` (when known) gives the MetaGraph picture its modalities
    and frozen marks, otherwise it is drawn from the MetaOps the plan records. ``measured``, a
    measured trace of a run of the plan (``spindle train --trace``), adds a measured step under
    the predicted timeline and the largest misses of the prediction."""
    warnings: list[str] = []
    body = _plan_body(plan, graph, plan_palette(plan), warnings, measured=measured)
    sub = f"{escape(plan.spec.path)} · mix {escape(plan.spec.mix or '-')} · {_cluster_line(plan)}"
    title = f"Spindle plan: {Path(plan.spec.path).name}"
    return Report(_page(title, sub, body, plan.spec.sha256), tuple(warnings))


def _phase_table(bundle: PlanBundle, colours: Palette) -> str:
    rows = []
    for i, bar in enumerate(phase_bars(bundle)):
        nxt = bundle.phases[i + 1].first_step - 1 if i + 1 < len(bundle.phases) else None
        plan = bundle.phases[i].plan
        batches = dict(bar.batches)
        cells = "".join(f"<td class='num'>{batches.get(t, 0) or '-'}</td>" for t in colours.tasks)
        rows.append(
            f"<tr><td><a href='#phase-{i + 1}'>{i + 1}</a></td>"
            f"<td>{bar.first_step}-{'' if nxt is None else nxt}</td><td>{escape(bar.mix)}</td>"
            f"{cells}<td class='num'>{escape(fmt_seconds(bar.iteration_s))}</td>"
            f"<td class='num'>{f'{bar.speedup:.2f}×' if bar.speedup else '-'}</td>"
            f"<td class='num'>{escape(fmt_bytes(max(plan.memory_bytes, default=0)))}</td>"
            f"<td class='num'>{len(plan.waves)}</td></tr>"
        )
    heads = "".join(
        f"<th class='num'><span class='sw' style='background:{colours[t].base}'></span>"
        f"{escape(t)}</th>"
        for t in colours.tasks
    )
    return (
        "<table><tr><th>phase</th><th>steps</th><th>mix</th>" + heads + "<th class='num'>"
        "iteration</th><th class='num'>vs sequential</th><th class='num'>peak memory</th>"
        "<th class='num'>waves</th></tr>" + "".join(rows) + "</table>"
    )


def build_bundle_report(
    bundle: PlanBundle, graphs: Mapping[str, MetaGraph] | None = None
) -> Report:
    """The page for a schedule's plans: the phases on a timeline of training steps, a table
    of them, then each phase's plan as the single-plan page shows it (``graphs``: each mix's
    MetaGraph, when known)."""
    warnings: list[str] = []
    colours = bundle_palette(bundle)
    first = bundle.phases[0].plan
    sections = []
    for i, p in enumerate(bundle.phases, start=1):
        nxt = bundle.phases[i].first_step - 1 if i < len(bundle.phases) else None
        steps = f"steps {p.first_step}-{'' if nxt is None else nxt}"
        body = _plan_body(p.plan, (graphs or {}).get(p.mix), colours, warnings, level=3)
        sections.append(
            f"<section id='phase-{i}'><h2>Phase {i}: mix {escape(p.mix)} ({steps})</h2>"
            f"{body}</section>"
        )
    picture = _figure(
        "Phases",
        _img(phases_svg(bundle, colours).encode(), "image/svg+xml", "phases"),
        "Training steps across; each phase's mix, predicted step time and speed-up on top, "
        "each task's batch below.",
    )
    sub = (
        f"{escape(bundle.spec.path)} · schedule of {len(bundle.phases)} phases · "
        f"{_cluster_line(first)}"
    )
    body = f"<h2>Phases</h2>{picture}{_phase_table(bundle, colours)}" + "".join(sections)
    title = f"Spindle plans: {Path(bundle.spec.path).name}"
    return Report(_page(title, sub, body, bundle.spec.sha256), tuple(warnings))


def write_report(
    path: str | os.PathLike[str],
    plan: Plan | PlanBundle,
    graph: MetaGraph | Mapping[str, MetaGraph] | None = None,
    measured: Mapping[str, Any] | None = None,
) -> Report:
    """Build the page (of a plan, or of a schedule's bundle) and write it atomically;
    ``measured``: a measured trace of a run of the plan (one plan only)."""
    if isinstance(plan, PlanBundle):
        if measured is not None:
            raise SpindleError(
                "a measured trace goes with one plan, not a bundle of phases: report one "
                "phase's plan with it"
            )
        report = build_bundle_report(plan, graph if isinstance(graph, Mapping) else None)
    else:
        report = build_report(plan, graph if isinstance(graph, MetaGraph) else None, measured)
    write_atomic(Path(path), report.html)
    return report
