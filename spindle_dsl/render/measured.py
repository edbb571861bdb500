"""A measured run's Chrome trace (``spindle train --trace``) read back into step timings.

The runtime's trace has, per rank (``tid``), a ``step N`` span around everything of a step and
inside it: forward and backward spans of each stage (args ``step``, ``metaop``, ``stage``,
``wave``), exchange spans (``exchange P`` forward into phase P, ``exchange P (grad)`` back),
the loss, the gradient reduction (``reduce``) and the optimizer. ``read_measured`` attributes
every span to the step it lies in and sums it per step by category, by MetaOp and by wave, so
they can be set against a plan's prediction (``render.compare``). The first step pays for
warm-up and is left out whenever there are more; each figure is then the median over steps of
the slowest rank's sum (a step ends when its slowest rank does).
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spindle_dsl.errors import SpindleError

# trace category -> the plan breakdown term it measures
TERMS = {
    "forward": "compute_s",
    "backward": "compute_s",
    "exchange": "transfer_s",
    "loss": "loss_s",
    "reduce": "grad_sync_s",
    "optimizer": "optimizer_s",
}
_EXCHANGE = re.compile(r"exchange (\d+)")


@dataclass(frozen=True)
class MeasuredRun:
    """Medians over the kept steps (seconds) of a measured trace."""

    steps: int  # steps in the trace
    kept: tuple[int, ...]  # the steps the medians are over
    step_s: float  # step time (the slowest rank's step span)
    terms: tuple[tuple[str, float], ...]  # breakdown term -> seconds
    metaops: tuple[tuple[str, float], ...]  # MetaOp -> forward + backward seconds
    waves: tuple[tuple[int, float], ...]  # wave -> forward + backward + its exchanges

    def term(self, name: str) -> float:
        return dict(self.terms).get(name, 0.0)


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A Chrome trace from a file; a clear error for a missing or malformed one."""
    try:
        data = json.loads(open(path, encoding="utf-8").read())  # noqa: SIM115
    except OSError as exc:
        raise SpindleError(f"cannot read trace {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SpindleError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise SpindleError(f"{path}: not a Chrome trace (no traceEvents list)")
    return data


def read_measured(trace: Mapping[str, Any], where: str = "<trace>") -> MeasuredRun:
    """Per-step sums of a measured trace (see the module docstring)."""
    spans = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    steps: dict[tuple[int, int], tuple[float, float]] = {}  # (tid, step) -> (start, end)
    for e in spans:
        if e.get("cat") == "step":
            m = re.fullmatch(r"step (\d+)", str(e.get("name", "")))
            if m:
                steps[(e["tid"], int(m.group(1)))] = (e["ts"], e["ts"] + e["dur"])
    if not steps:
        raise SpindleError(
            f"{where}: no step spans; is this a measured trace from `spindle train --trace`?"
        )
    per_tid: dict[int, list[tuple[float, float, int]]] = {}
    for (tid, step), (a, b) in steps.items():
        per_tid.setdefault(tid, []).append((a, b, step))
    numbers = sorted({s for _, s in steps})
    kept = tuple(numbers[1:] if len(numbers) > 1 else numbers)
    # (step, tid) -> sums
    cats: dict[tuple[int, int], dict[str, float]] = {}
    ops: dict[tuple[int, int], dict[str, float]] = {}
    waves: dict[tuple[int, int], dict[int, float]] = {}
    for e in spans:
        cat = e.get("cat")
        if cat == "step" or cat not in TERMS:
            continue
        tid, mid = e["tid"], e["ts"] + e["dur"] / 2
        step = next((s for a, b, s in per_tid.get(tid, ()) if a <= mid <= b), None)
        if step is None:
            continue
        seconds = e["dur"] / 1e6
        key = (step, tid)
        sums = cats.setdefault(key, {})
        sums[TERMS[cat]] = sums.get(TERMS[cat], 0.0) + seconds
        args = e.get("args") or {}
        wave = args.get("wave")
        if cat in ("forward", "backward"):
            op = str(args.get("metaop", "?"))
            ops.setdefault(key, {})[op] = ops.setdefault(key, {}).get(op, 0.0) + seconds
        elif cat == "exchange":
            m = _EXCHANGE.match(str(e.get("name", "")))
            wave = int(m.group(1)) if m else None
        if wave is not None:
            w = int(wave)
            waves.setdefault(key, {})[w] = waves.setdefault(key, {}).get(w, 0.0) + seconds
    tids = sorted(per_tid)

    def median_of_max(table: Mapping[tuple[int, int], Mapping[Any, float]], name: Any) -> float:
        per_step = [max(table.get((s, t), {}).get(name, 0.0) for t in tids) for s in kept]
        return statistics.median(per_step) if per_step else 0.0

    step_s = statistics.median(
        max(b - a for (t, s), (a, b) in steps.items() if s == k) / 1e6 for k in kept
    )
    term_names = sorted({n for d in cats.values() for n in d})
    op_names = sorted({n for d in ops.values() for n in d})
    wave_names = sorted({n for d in waves.values() for n in d})
    return MeasuredRun(
        steps=len(numbers),
        kept=kept,
        step_s=step_s,
        terms=tuple((n, median_of_max(cats, n)) for n in term_names),
        metaops=tuple((n, median_of_max(ops, n)) for n in op_names),
        waves=tuple((n, median_of_max(waves, n)) for n in wave_names),
    )
