"""Training curves from a run's step log (``spindle train --log-json``): loss and learning rate
against the step.

The log is the one ``spindle train`` writes, one JSON object per line; a resumed run appends
to it, so a step may appear twice (the interrupted run's and the resumed one's), and the later
line wins. The picture has two panels sharing the step axis: each task's training loss (a
line) and held-out loss (markers, at the steps that evaluated), and the learning rate.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from spindle_dsl.errors import SpindleError

WIDTH_IN, HEIGHT_IN, DPI = 8.0, 6.0, 110


@dataclass(frozen=True)
class Curves:
    """Per step (sorted): each task's loss, held-out loss and the learning rate."""

    steps: tuple[int, ...]
    loss: dict[str, tuple[tuple[int, float], ...]]
    eval_loss: dict[str, tuple[tuple[int, float], ...]]
    lr: tuple[tuple[int, float], ...]


def read_log(path: str | Path) -> Curves:
    """The curves of a ``--log-json`` file; a file that is not one is a ``SpindleError``
    naming the line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SpindleError(f"cannot read {path}: {exc.strerror or exc}") from None
    by_step: dict[int, dict] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = int(record["step"])
            dict(record["loss"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise SpindleError(
                f"{path}:{number}: not a step record of spindle train --log-json"
            ) from None
        by_step[step] = record
    if not by_step:
        raise SpindleError(f"{path} holds no step record")
    steps = tuple(sorted(by_step))
    return Curves(
        steps=steps,
        loss=_per_task(by_step, steps, "loss"),
        eval_loss=_per_task(by_step, steps, "eval_loss"),
        lr=tuple((s, float(by_step[s]["lr"])) for s in steps if "lr" in by_step[s]),
    )


def _per_task(by_step: dict[int, dict], steps: tuple[int, ...], key: str) -> dict:
    out: dict[str, list[tuple[int, float]]] = {}
    for s in steps:
        for task, value in (by_step[s].get(key) or {}).items():
            out.setdefault(task, []).append((s, float(value)))
    return {task: tuple(points) for task, points in out.items()}


def training_plot_bytes(curves: Curves, fmt: str = "png", title: str | None = None) -> bytes:
    """The two panels as PNG (or SVG/PDF) bytes."""
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    loss_ax, lr_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    colours = matplotlib.colormaps["tab10"]
    tasks = list(dict.fromkeys([*curves.loss, *curves.eval_loss]))
    for i, task in enumerate(tasks):
        colour = colours(i % 10)
        if task in curves.loss:
            xs, ys = zip(*curves.loss[task], strict=True)
            loss_ax.plot(xs, ys, color=colour, linewidth=1.2, label=f"{task} (train)")
        if task in curves.eval_loss:
            xs, ys = zip(*curves.eval_loss[task], strict=True)
            loss_ax.plot(xs, ys, color=colour, linestyle="--", marker="o", markersize=4,
                         label=f"{task} (held out)")  # fmt: skip
    loss_ax.set_ylabel("loss")
    loss_ax.legend(fontsize=8, frameon=False)
    loss_ax.grid(alpha=0.3)
    if curves.lr:
        xs, ys = zip(*curves.lr, strict=True)
        lr_ax.plot(xs, ys, color="black", linewidth=1.2)
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("step")
    lr_ax.grid(alpha=0.3)
    loss_ax.set_title(title or "training", fontsize=10)
    buf = io.BytesIO()
    meta = {"Date": None} if fmt == "svg" else {}
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "spindle"}):
        fig.savefig(buf, format=fmt, metadata=meta)
    return buf.getvalue()
