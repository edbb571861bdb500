"""The plan as a timeline: devices down, time across, one bar per entry, idle time hatched.

Drawn with matplotlib (object API and the Agg/SVG backends only, never pyplot, so it works
headless, in threads and inside Jupyter without touching the user's figure state). A wave
boundary is a dashed vertical line with the wave's index above it; node boundaries are
horizontal lines; an entry on several consecutive devices is one bar spanning their rows, with
its module and layer range written inside when the text fits.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from spindle_dsl.errors import SpindleError
from spindle_dsl.plan.model import Plan
from spindle_dsl.render.colors import IDLE_FILL, Palette
from spindle_dsl.render.dot_waves import plan_title
from spindle_dsl.render.fmt import device_runs, time_unit
from spindle_dsl.render.schedule import (
    Idle,
    Overhead,
    Placed,
    idle_spans,
    overhead,
    placed_entries,
    plan_palette,
)

TIMELINE_FORMATS = ("svg", "png", "pdf")
WIDTH_IN = 13.0
OVERHEAD_FILL = "#e6e6f2"
DPI = 110


def _idle_runs(idle: list[Idle]) -> list[tuple[float, float, int, int]]:
    """Merge idle spans of neighbouring devices with the same times: (start, dur, first, n)."""
    groups: dict[tuple[int, float, float], list[int]] = {}
    for s in idle:
        groups.setdefault((s.wave, s.start_s, s.duration_s), []).append(s.device)
    out = []
    for (_, start, dur), devs in groups.items():
        for first, n in device_runs(devs):
            out.append((start, dur, first, n))
    return out


def _label_fit(
    width_px: float, height_px: float, texts: tuple[str, ...]
) -> tuple[str, float, int] | None:
    """The first text that fits in a bar, with its font size and rotation: across the bar
    first, then upright for tall narrow bars (a wide device group running a short entry)."""
    for text in texts:
        for rotation, along, across in ((0, width_px, height_px), (90, height_px, width_px)):
            size = max(6.0, min(9.0, across * 0.55))
            if len(text) * size * 0.62 < along - 4 and across >= size + 2:
                return text, size, rotation
    return None


def timeline_figure(
    plan: Plan, colours: Palette | None = None, total_s: float = 0.0
):  # -> matplotlib Figure
    """Build the figure (not saved): callers pick the format. ``total_s`` lengthens the time
    axis (the report draws a measured step under it on one scale)."""
    from matplotlib.figure import Figure

    colours = colours or plan_palette(plan)
    placed = placed_entries(plan)
    devices = plan.cluster.devices
    total = max(plan.iteration_s, sum(w.duration_s for w in plan.waves), total_s, 1e-12)
    scale, unit = time_unit(total)
    row_in = 0.32 if devices <= 16 else max(0.14, 9.0 / devices)
    height = min(2.2 + devices * row_in, 18.0)
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_xlim(0, total * scale)
    ax.set_ylim(devices, 0)
    frame = _Frame(
        ax=ax,
        scale=scale,
        total=total,
        devices=devices,
        ax_width_px=WIDTH_IN * 0.85 * DPI,  # the axes' share once labels take their room
        row_px=(height - 1.6) * DPI / devices,
    )
    _draw_idle(frame, plan, placed)
    tail = overhead(plan)
    if tail is not None:
        _draw_overhead(frame, tail)
    _draw_entries(frame, placed, colours)
    _draw_waves(frame, plan)
    _draw_device_axis(ax, plan)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(plan_title(plan), fontsize=10, pad=22)
    _draw_legend(fig, colours, tail)
    return fig


@dataclass(frozen=True)
class _Frame:
    """The axes the timeline is drawn on and how to place things on them: ``scale`` turns
    seconds into the time axis' unit, ``total`` is the axis' length in seconds, and the
    pixel sizes (the axes' width, one device row's height) decide which labels fit."""

    ax: Any
    scale: float
    total: float
    devices: int
    ax_width_px: float
    row_px: float


def _draw_idle(frame: _Frame, plan: Plan, placed: tuple[Placed, ...]) -> None:
    """Hatch each device's idle time in every wave (neighbouring devices merged)."""
    from matplotlib.patches import Rectangle

    scale = frame.scale
    for start, dur, first, n in _idle_runs(idle_spans(plan, placed)):
        frame.ax.add_patch(
            Rectangle(
                (start * scale, first),
                dur * scale,
                n,
                facecolor=IDLE_FILL,
                edgecolor="#c8c8c8",
                hatch="///",
                linewidth=0,
                zorder=1,
            )
        )


def _draw_overhead(frame: _Frame, tail: Overhead) -> None:
    """Shade the step's overhead after the waves across every device, labelled where the
    label fits."""
    from matplotlib.patches import Rectangle

    ax, scale, devices = frame.ax, frame.scale, frame.devices
    ax.add_patch(
        Rectangle(
            (tail.start_s * scale, 0),
            tail.duration_s * scale,
            devices,
            facecolor=OVERHEAD_FILL,
            edgecolor="#b8b8d0",
            hatch="..",
            linewidth=0,
            zorder=1,
        )
    )
    fit = _label_fit(
        tail.duration_s / frame.total * frame.ax_width_px, devices * frame.row_px, (tail.label,)
    )
    if fit is not None:
        ax.text(
            (tail.start_s + tail.duration_s / 2) * scale,
            devices / 2,
            fit[0],
            ha="center",
            va="center",
            rotation=fit[2],
            fontsize=fit[1],
            color="#333355",
            zorder=4,
            bbox={"facecolor": OVERHEAD_FILL, "edgecolor": "none", "pad": 1},
        )


def entry_labels(p: Placed) -> tuple[str, ...]:
    """An entry's labels, longest first: module, layer range and, when it is tensor
    parallel, its data x tensor layout."""
    span = f"[{p.entry.first},{p.entry.end})"
    dp, tp = p.op.layout_at(len(p.entry.devices))
    plain = (f"{p.op.module} {span}", span)
    return (f"{p.op.module} {span} {dp}x{tp} tp", *plain) if tp > 1 else plain


def _draw_entries(frame: _Frame, placed: tuple[Placed, ...], colours: Palette) -> None:
    """One bar per entry and run of consecutive devices, in its task's colour, with its
    module and layer range (or the range alone) inside where the text fits."""
    from matplotlib.patches import Rectangle

    ax, scale = frame.ax, frame.scale
    for p in placed:
        col = colours[p.op.task]
        x, w = p.start_s * scale, p.entry.time_s * scale
        for first, n in device_runs(p.entry.devices):
            ax.add_patch(
                Rectangle(
                    (x, first + 0.06),
                    w,
                    n - 0.12,
                    facecolor=col.base,
                    edgecolor="white",
                    linewidth=0.6,
                    zorder=2,
                )
            )
            fit = _label_fit(
                p.entry.time_s / frame.total * frame.ax_width_px,
                n * frame.row_px,
                entry_labels(p),
            )
            if fit is not None:
                text, size, rotation = fit
                ax.text(
                    x + w / 2,
                    first + n / 2,
                    text,
                    ha="center",
                    va="center",
                    rotation=rotation,
                    fontsize=size,
                    color=col.text,
                    clip_on=True,
                    zorder=4,
                )


def _draw_waves(frame: _Frame, plan: Plan) -> None:
    """A dashed line at each wave boundary (and after the last wave), with the wave's index
    above it, skipping labels that would touch the previous one."""
    from matplotlib.transforms import blended_transform_factory

    ax, scale = frame.ax, frame.scale
    top = blended_transform_factory(ax.transData, ax.transAxes)
    waves = sorted(plan.waves, key=lambda w: w.index)
    last_label_px = -1e9
    for wave in waves:
        ax.axvline(wave.start_s * scale, color="#444444", linestyle="--", linewidth=0.8)
        mid_px = (wave.start_s + wave.duration_s / 2) / frame.total * frame.ax_width_px
        if mid_px - last_label_px >= 8 * len(f"w{wave.index}"):  # skip labels that would touch
            last_label_px = mid_px
            mid = (wave.start_s + wave.duration_s / 2) * scale
            ax.text(
                mid,
                1.01,
                f"w{wave.index}",
                transform=top,
                ha="center",
                va="bottom",
                fontsize=7,
                color="#444444",
            )
    if waves:
        last = waves[-1]
        ax.axvline(
            (last.start_s + last.duration_s) * scale, color="#444444", linestyle="--", linewidth=0.8
        )


def _draw_device_axis(ax: Any, plan: Plan) -> None:
    """Lines at node boundaries and a label per device row (per node's first device on
    clusters over 32 devices)."""
    devices = plan.cluster.devices
    per_node = plan.cluster.devices_per_node
    for b in range(per_node, devices, per_node):
        ax.axhline(b, color="#222222", linewidth=1.0, zorder=1.5)
    if devices <= 32:
        ticks = list(range(devices))
        labels = [f"dev {d}" for d in ticks]
    else:
        ticks = list(range(0, devices, per_node))
        labels = [f"node {d // per_node} · dev {d}" for d in ticks]
    ax.set_yticks([t + 0.5 for t in ticks], labels, fontsize=7)


def _draw_legend(fig: Any, colours: Palette, tail: Overhead | None) -> None:
    """The legend under the axes: each task's colour, idle time, and the overhead if any."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c.base, label=c.task) for c in colours.colours]
    handles.append(Patch(facecolor=IDLE_FILL, edgecolor="#c8c8c8", hatch="///", label="idle"))
    if tail is not None:
        handles.append(
            Patch(facecolor=OVERHEAD_FILL, edgecolor="#b8b8d0", hatch="..", label=tail.label)
        )
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(handles), 8),
        fontsize=8,
        frameon=False,
    )


def timeline_bytes(
    plan: Plan, fmt: str = "svg", colours: Palette | None = None, total_s: float = 0.0
) -> bytes:
    """The timeline as SVG, PNG or PDF bytes (no ``dot`` needed)."""
    if fmt not in TIMELINE_FORMATS:
        raise SpindleError(
            f"a timeline can be written as {', '.join(TIMELINE_FORMATS)}, not '{fmt}'"
        )
    import matplotlib

    fig = timeline_figure(plan, colours, total_s)
    buf = io.BytesIO()
    meta = {"Date": None} if fmt == "svg" else {}
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "spindle"}):
        fig.savefig(buf, format=fmt, metadata=meta)
    return buf.getvalue()
