"""The plan in a few numbers: iteration time, speed-ups over the baselines, the bound, the
memory levers (micro-batches, ZeRO stage, recompute) and peak memory against capacity.

A researcher moving a slider wants to see at once whether the plan got better, so the headline
is the speed-up over each baseline the planner computed (``baseline_s / iteration_s``), next to
how far the plan is from the proven lower bound. The numbers are computed here as values (for
tests and notebooks) and formatted as a small HTML table for the widget.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from spindle_dsl.plan.model import Plan
from spindle_dsl.render.gap import gap_terms


@dataclass(frozen=True)
class Speedup:
    baseline: str  # the baseline's name without the "_s" suffix, e.g. "sequential"
    baseline_s: float
    speedup: float  # baseline_s / iteration_s: > 1 means the plan is faster


@dataclass(frozen=True)
class Summary:
    iteration_s: float
    lower_bound_s: float
    gap_to_bound: float  # iteration_s / lower_bound_s - 1 (0 means provably optimal)
    lp_bound: bool  # the bound is the LP relaxation's (plans before it carry the area bound)
    area_path_s: float | None  # the area / critical-path bound beside the LP's, if recorded
    speedups: tuple[Speedup, ...]
    waves: int
    devices: int
    device: str
    solver: str
    status: str
    planning_s: float
    peak_memory_bytes: int | None  # the fullest device, when the plan predicts memory
    memory_capacity_bytes: int
    notes: tuple[str, ...]  # the planner's remarks: which schedule won, what does not fit
    # the memory levers the plan pulls: passes per iteration, ZeRO stage, MetaOps recomputing
    micro_batches: int = 1
    zero_stage: int = 1
    recompute: tuple[str, ...] = ()
    metaops: int = 0
    least_memory_bytes: int | None = None  # the emptiest device
    # where the compute over the LP bound goes (``Plan.busy_s``, ``Plan.idle_share``): the
    # waves' time and the entries' device-seconds over N, each over the LP; None without one
    compute_over_lp: float | None = None
    busy_over_lp: float | None = None
    idle_share: float = 0.0
    # iteration - bound term by term (``Plan.gap_split``); empty where the bound records no
    # floors
    gap_split: tuple[tuple[str, float], ...] = ()

    @property
    def fits(self) -> bool | None:
        if self.peak_memory_bytes is None:
            return None
        return self.peak_memory_bytes <= self.memory_capacity_bytes


def summarize(plan: Plan) -> Summary:
    speedups = tuple(
        Speedup(name.removesuffix("_s"), secs, secs / plan.iteration_s)
        for name, secs in plan.baselines
        if plan.iteration_s > 0
    )
    gap = plan.iteration_s / plan.lower_bound_s - 1 if plan.lower_bound_s > 0 else float("nan")
    bounds = plan.extra.get("bounds") or {}
    over_lp = plan.over_lp()
    return Summary(
        iteration_s=plan.iteration_s,
        lower_bound_s=plan.lower_bound_s,
        gap_to_bound=gap,
        lp_bound=bounds.get("lp_s") is not None,
        area_path_s=bounds.get("area_path_s"),
        speedups=speedups,
        waves=len(plan.waves),
        devices=plan.cluster.devices,
        device=plan.cluster.device,
        solver=plan.solver.name,
        status=plan.solver.status,
        planning_s=plan.solver.wall_s,
        peak_memory_bytes=max(plan.memory_bytes) if plan.memory_bytes else None,
        memory_capacity_bytes=plan.cluster.memory_bytes,
        notes=plan.notes,
        micro_batches=plan.micro_batches,
        zero_stage=plan.zero_stage,
        recompute=tuple(m.id for m in plan.metaops if m.recompute),
        metaops=len(plan.metaops),
        least_memory_bytes=min(plan.memory_bytes) if plan.memory_bytes else None,
        compute_over_lp=over_lp[0] if over_lp else None,
        busy_over_lp=over_lp[1] if over_lp else None,
        idle_share=plan.idle_share(),
        gap_split=plan.gap_split() or (),
    )


def fmt_s(seconds: float) -> str:
    """Seconds with a unit chosen from the value (plans span microseconds to minutes)."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def fmt_gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def summary_html(s: Summary, *, stale: bool = False) -> str:
    """A compact table; ``stale`` greys it out and says it is the last good plan."""
    other = (
        f"; area / critical path {fmt_s(s.area_path_s)}"
        if s.lp_bound and s.area_path_s is not None
        else ""
    )
    rows = [
        ("iteration", f"<b>{fmt_s(s.iteration_s)}</b>"),
        (
            "LP lower bound" if s.lp_bound else "lower bound",
            f"{fmt_s(s.lower_bound_s)} (iteration / bound <b>{1 + s.gap_to_bound:.2f}×</b>, "
            f"{100 * s.gap_to_bound:.1f}% above{other})",
        ),
    ]
    if s.compute_over_lp is not None and s.busy_over_lp is not None:
        rows.append(
            (
                "compute / LP bound",
                f"{s.compute_over_lp:.2f}× (entries {s.busy_over_lp:.2f}× the LP's "
                f"device-seconds, {s.idle_share:.1%} idle inside waves)",
            )
        )
    terms = gap_terms(dict(s.gap_split))
    if terms:
        rows.append(
            (
                "gap to bound",
                ", ".join(
                    f"{escape(words)} {'−' if secs < 0 else ''}{fmt_s(abs(secs))} "
                    f"({abs(share):.0%})"
                    for words, secs, share in terms[:4]
                ),
            )
        )
    for sp in s.speedups:
        rows.append(
            (f"vs {escape(sp.baseline)}", f"<b>{sp.speedup:.2f}×</b> ({fmt_s(sp.baseline_s)})")
        )
    rows.append(("waves", str(s.waves)))
    rows.append(("cluster", f"{s.devices} × {escape(s.device)}"))
    rows.append(
        (
            "memory levers",
            f"{s.micro_batches} micro-batch{'es' if s.micro_batches > 1 else ''}, "
            f"ZeRO-{s.zero_stage}, recompute {len(s.recompute)}/{s.metaops}",
        )
    )
    if s.peak_memory_bytes is not None:
        verdict = "fits" if s.fits else "<b style='color:#c00'>does not fit</b>"
        share = s.peak_memory_bytes / s.memory_capacity_bytes
        least = (
            f", least {fmt_gib(s.least_memory_bytes)}" if s.least_memory_bytes is not None else ""
        )
        rows.append(
            (
                "peak memory",
                f"{fmt_gib(s.peak_memory_bytes)} of {fmt_gib(s.memory_capacity_bytes)} "
                f"({share:.0%}, {verdict}){least}",
            )
        )
    rows.append(
        ("solver", f"{escape(s.solver)} ({escape(s.status)}, {fmt_s(s.planning_s)})"),
    )
    body = "".join(
        f"<tr><td style='padding-right:1em;color:#555'>{k}</td><td>{v}</td></tr>" for k, v in rows
    )
    notes = "".join(f"<li>{escape(n)}</li>" for n in s.notes)
    if notes:
        body += (
            f"<tr><td colspan='2'><ul style='margin:0;padding-left:1.2em'>{notes}</ul></td></tr>"
        )
    style = "opacity:0.45" if stale else ""
    head = "<div style='color:#a60'>last good plan: the current settings have errors</div>"
    return f"{head if stale else ''}<div style='{style}'><table>{body}</table></div>"
