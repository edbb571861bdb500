"""A plan's prediction set against a measured run: per step term, per wave and per MetaOp.

The prediction is the plan's own: its breakdown (``cost.step`` prices every term) and, per
wave and per entry, the times the plan records, with the overheads the step model put on top
of them (the plan's ``step_model`` field: each wave's input stages, stage costs and transfers).
A plan with ``micro_batches`` k runs its waves k times per step, so its per-wave and per-MetaOp
figures count k times. The measured side is ``render.measured``. Rows come largest miss first
(``measured - predicted``, by size), so what the model gets most wrong is on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spindle_dsl.plan.model import Plan
from spindle_dsl.render.measured import MeasuredRun

# (row name, plan breakdown terms it adds up, measured term)
TERM_ROWS = (
    ("layers and input stages", ("compute_s", "wave_overhead_s"), "compute_s"),
    ("activation exchange", ("transfer_s",), "transfer_s"),
    ("losses", ("loss_s",), "loss_s"),
    ("gradient reduction", ("grad_sync_s",), "grad_sync_s"),
    ("optimizer", ("optimizer_s",), "optimizer_s"),
)


@dataclass(frozen=True)
class Miss:
    """One figure predicted and measured (seconds per step)."""

    kind: str  # "step", "term", "wave" or "metaop"
    name: str
    predicted_s: float
    measured_s: float

    @property
    def miss_s(self) -> float:
        return self.measured_s - self.predicted_s

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "predicted_s": self.predicted_s,
            "measured_s": self.measured_s,
            "miss_s": self.miss_s,
            "ratio": self.ratio if self.predicted_s > 0 else None,
        }


def _record(plan: Plan) -> dict[str, Any]:
    rec = plan.extra.get("step_model")
    return rec if isinstance(rec, dict) else {}


def predicted_waves(plan: Plan) -> dict[int, float]:
    """Each wave's predicted seconds per step: its duration, the overheads on top and its
    transfers, times the passes."""
    rec = _record(plan)
    extra = rec.get("wave_extra_s") or []
    moves = rec.get("wave_transfer_s") or []
    k = plan.micro_batches
    out = {}
    for i, w in enumerate(sorted(plan.waves, key=lambda w: w.index)):
        more = (extra[i] if i < len(extra) else 0.0) + (moves[i] if i < len(moves) else 0.0)
        out[w.index] = k * (w.duration_s + more)
    return out


def predicted_metaops(plan: Plan) -> dict[str, float]:
    """Each MetaOp's predicted seconds per step: its entries, with their own overheads."""
    per_entry = _record(plan).get("entry_extra_s") or []
    out: dict[str, float] = {}
    for i, w in enumerate(sorted(plan.waves, key=lambda w: w.index)):
        extras = per_entry[i] if i < len(per_entry) else []
        for j, e in enumerate(w.entries):
            more = extras[j] if j < len(extras) else 0.0
            out[e.metaop] = out.get(e.metaop, 0.0) + plan.micro_batches * (e.time_s + more)
    return out


def compare(plan: Plan, run: MeasuredRun) -> tuple[Miss, ...]:
    """Every row, the whole step first, then the rest by the size of the miss."""
    parts = dict(plan.breakdown)
    rows = [
        Miss("term", name, sum(parts.get(t, 0.0) for t in terms), run.term(measured))
        for name, terms, measured in TERM_ROWS
        if any(t in parts for t in terms) or run.term(measured)
    ]
    waves = predicted_waves(plan)
    measured_waves = dict(run.waves)
    rows += [
        Miss("wave", f"wave {w}", waves.get(w, 0.0), measured_waves.get(w, 0.0))
        for w in sorted(set(waves) | set(measured_waves))
    ]
    ops = predicted_metaops(plan)
    measured_ops = dict(run.metaops)
    rows += [
        Miss("metaop", m, ops.get(m, 0.0), measured_ops.get(m, 0.0))
        for m in sorted(set(ops) | set(measured_ops))
    ]
    rows.sort(key=lambda r: -abs(r.miss_s))
    return (Miss("step", "step", plan.iteration_s, run.step_s), *rows)


def largest_misses(rows: tuple[Miss, ...], count: int = 3) -> tuple[Miss, ...]:
    """The ``count`` largest misses among waves and MetaOps (where a plan can be fixed)."""
    return tuple(r for r in rows if r.kind in ("wave", "metaop"))[:count]


def compare_table(rows: tuple[Miss, ...], top: int | None = None) -> str:
    """The rows as a text table, largest miss first after the step row."""
    head = f"{'':<7}{'':<34}{'predicted':>11}{'measured':>11}{'miss':>11}{'ratio':>8}"
    lines = [head]
    shown = rows if top is None else rows[: top + 1]
    for r in shown:
        ratio = f"{r.ratio:.2f}" if r.predicted_s > 0 else "-"
        lines.append(
            f"{r.kind:<7}{r.name[:33]:<34}{r.predicted_s * 1e3:>9.2f}ms{r.measured_s * 1e3:>9.2f}ms"
            f"{r.miss_s * 1e3:>+9.2f}ms{ratio:>8}"
        )
    return "\n".join(lines)


def summary_text(rows: tuple[Miss, ...], misses: tuple[Miss, ...]) -> str:
    """The train summary's part: each step term predicted and measured, then the misses."""
    lines = [f"{'where the time goes':<26}{'predicted':>11}{'measured':>11}"]
    terms = {r.name: r for r in rows if r.kind == "term"}
    for name, _, _ in TERM_ROWS:  # in the step's order, not the misses'
        if name in terms:
            r = terms[name]
            lines.append(f"  {r.name:<24}{r.predicted_s:>10.4f}s{r.measured_s:>10.4f}s")
    if misses:
        lines.append("largest misses (spindle compare PLAN TRACE lists all):")
        for r in misses:
            lines.append(
                f"  {r.kind} {r.name}: predicted {r.predicted_s * 1e3:.2f} ms, measured "
                f"{r.measured_s * 1e3:.2f} ms ({r.miss_s * 1e3:+.2f} ms)"
            )
    return "\n".join(lines)
