"""Rank 0's view of a run while it runs: a progress line per step, then a summary.

The line shows step time, tokens per second, the time left (from the median step so far),
each task's loss and the learning rate, and each task's held-out loss after a step that
evaluated; on a terminal it rewrites itself in place, elsewhere (CI logs, pipes) it prints one
line per step. The summary puts the
measured step time beside the plan's prediction, the number the planner optimised, so a user
sees at once how far the cost model is from this machine.
"""

from __future__ import annotations

import statistics
import sys
from typing import TextIO

from ..base import RunResult, StepRecord


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s`` or ``2h07m``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    def __init__(self, total: int, samples_per_step: int, stream: TextIO | None = None):
        self.total, self.samples = total, samples_per_step
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.open = False
        self.times: list[float] = []

    def eta(self, step: int) -> float:
        """Seconds left after ``step``: the steps left at the median step time so far (the
        first step, which pays for warm-up, left out once there are others)."""
        times = self.times[1:] if len(self.times) > 1 else self.times
        return (self.total - step) * statistics.median(times) if times else 0.0

    def update(self, record: StepRecord) -> None:
        step, seconds = record.step, record.seconds
        self.times.append(seconds)
        tokens = record.tokens / seconds if seconds > 0 else float("inf")
        loss = "  ".join(f"{t} {v:.4f}" for t, v in record.losses)
        width = len(str(self.total))
        line = (
            f"step {step:>{width}}/{self.total}  {seconds:7.3f} s  {tokens:9.0f} tok/s  "
            f"eta {_duration(self.eta(step)):>6}  {loss}"
        )
        if record.lr is not None:
            line += f"  lr {record.lr:.3g}"
        if record.eval_losses:
            line += "  eval " + "  ".join(f"{t} {v:.4f}" for t, v in record.eval_losses)
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self.open = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """A line of its own between progress lines (a schedule's switch of plans)."""
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.stream.flush()
            self.open = False


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def summary(
    result: RunResult, sequential_s: float | None = None, *, calibrated: bool = True
) -> str:
    """Measured vs predicted step time, and where the run left its files. ``calibrated``
    False: the prediction is the analytic model's first guess for CPU workers, so no ratio is
    printed (the caller says why, and how to calibrate it)."""
    lines = [f"trained {len(result.steps)} steps on {result.world_size} ranks ({result.backend})"]
    if result.resumed_from:
        lines[0] += f", resumed from step {result.resumed_from}"
    if result.steps:
        last = result.steps[-1]
        losses = ", ".join(f"{t} {v:.4f}" for t, v in last.losses)
        lines.append(f"final loss (step {last.step}): {losses}")
        evaluated = [r for r in result.steps if r.eval_losses]
        if evaluated:
            held = ", ".join(f"{t} {v:.4f}" for t, v in evaluated[-1].eval_losses or ())
            lines.append(f"held-out loss (step {evaluated[-1].step}): {held}")
    if not result.steps:
        lines.append(f"nothing to do: the checkpoint is already at step {result.resumed_from}")
        return "\n".join(lines)
    measured, predicted = result.measured_step_s, result.predicted_step_s
    lines.append(f"{'step time':<22}{'measured':>12}{'predicted':>12}{'ratio':>9}")
    ratio = measured / predicted if predicted > 0 else float("nan")
    shown = f"{ratio:>9.2f}" if calibrated else f"{'-':>9}  (uncalibrated: see the note below)"
    lines.append(f"{'  this plan':<22}{measured:>11.4f}s{predicted:>11.4f}s{shown}")
    if sequential_s is not None:
        lines.append(f"{'  sequential (plan)':<22}{'-':>12}{sequential_s:>11.4f}s")
    held = result.extra.get("optimizer_state_bytes")
    if held:
        lines.append(
            f"optimizer state per rank: {_mib(min(held))} to {_mib(max(held))}, "
            f"{_mib(sum(held))} in all"
        )
    lines += memory_lines(result)
    if result.checkpoint:
        lines.append(f"checkpoint: {result.checkpoint}")
    if result.trace:
        lines.append(f"measured trace: {result.trace}")
    return "\n".join(lines)


def memory_lines(result: RunResult) -> list[str]:
    """Each rank's measured peak tensor bytes beside the plan's prediction."""
    measured = result.extra.get("measured_peak_bytes") or []
    if not any(measured):
        return []
    predicted = result.extra.get("predicted_peak_bytes") or [None] * len(measured)
    terms = result.extra.get("peak_terms") or [{}] * len(measured)
    head = f"{'peak memory':<14}{'measured':>14}{'predicted':>14}{'pred/meas':>10}"
    out = [head + "  measured at the peak (MiB)"]
    for rank, (m, p, t) in enumerate(zip(measured, predicted, terms, strict=True)):
        ratio = f"{p / m:>10.2f}" if p and m else f"{'-':>10}"
        pred = _mib(p) if p else "-"
        parts = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in t.items() if v)
        out.append(f"{'  rank ' + str(rank):<14}{_mib(m):>14}{pred:>14}{ratio}  {parts}")
    return out
