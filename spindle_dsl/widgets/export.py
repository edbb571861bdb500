"""One-click export of what the widget shows: plan JSON, Chrome trace, HTML report, spec text.

A plan found by playing with sliders is only useful if it can leave the notebook: ``plan.json``
feeds ``spindle train --plan``, the trace opens in Perfetto, the report goes to colleagues. A
spec whose schedule the widget followed also gets its plan bundle (every phase's plan), and
the report shows every phase. The
spec text actually compiled is saved beside them (with the generated mix when weights were
changed), so ``spindle plan`` on that file with the same flags reproduces the plan.

Files are named after the spec and the cluster (``tiny_mm-8xcpu.plan.json``) so exports of
different settings sit side by side instead of overwriting each other.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from spindle_dsl.atomic import write_atomic
from spindle_dsl.errors import SpindleError
from spindle_dsl.widgets.state import Result


@dataclass(frozen=True)
class Exported:
    """The files one export wrote, and what the report could not draw."""

    plan: Path
    trace: Path
    report: Path
    spec: Path
    command: str  # the `spindle plan` command that reproduces the plan from ``spec``
    warnings: tuple[str, ...] = ()
    bundle: Path | None = None  # every phase's plan, when the spec's schedule was followed

    @property
    def paths(self) -> tuple[Path, ...]:
        extra = (self.bundle,) if self.bundle is not None else ()
        return (self.plan, self.trace, self.report, self.spec, *extra)


def export_stem(result: Result) -> str:
    """``<spec name>-<devices>x<device>``, safe as a file name on every platform."""
    name = Path(result.settings.path).stem if result.settings.path != "<string>" else "spec"
    c = result.plan.cluster
    raw = f"{name}-{c.devices}x{c.device}"
    if result.effective_mix and result.effective_mix != (
        result.mixes[0].name if result.mixes else None
    ):
        raw += f"-{result.effective_mix}"
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", raw)


def reproduce_command(result: Result, spec_file: Path, plan_file: Path) -> str:
    """The CLI line that makes the same plan (a schedule's: the same bundle) from the
    exported spec."""
    s = result.settings
    parts = ["spindle", "plan", str(spec_file)]
    if result.effective_mix and result.bundle is None:
        parts += ["--mix", result.effective_mix]
    if s.devices is not None:
        parts += ["--devices", str(s.devices)]
    if s.device is not None:
        parts += ["--device", s.device]
    if s.scheduler != "default":
        parts += ["--scheduler", s.scheduler]
    parts += ["--time-limit", f"{s.time_limit_s:g}"]
    if not s.check_memory:
        parts.append("--no-memory-check")
    parts += ["--out", str(plan_file)]
    return " ".join(parts)


def export_result(result: Result, folder: str | os.PathLike[str]) -> Exported:
    """Write the four files into ``folder`` (created if needed); SpindleError if it cannot."""
    from spindle_dsl.render.report import write_report
    from spindle_dsl.render.trace import plan_trace, write_trace

    out = Path(folder).expanduser()
    stem = export_stem(result)
    plan_p = out / f"{stem}.plan.json"
    trace_p = out / f"{stem}.trace.json"
    report_p = out / f"{stem}.report.html"
    spec_p = out / f"{stem}.spindle"
    bundle_p = out / f"{stem}.bundle.json" if result.bundle is not None else None
    try:
        if out.exists() and not out.is_dir():
            raise SpindleError(f"cannot export to {out}: it is a file, not a folder")
        write_atomic(spec_p, result.effective_text)
        result.plan.write(plan_p)
        write_trace(trace_p, plan_trace(result.plan))
        if result.bundle is not None and bundle_p is not None:
            result.bundle.write(bundle_p)  # the report then shows every phase
            report = write_report(report_p, result.bundle, {result.graph.mix or "": result.graph})
        else:
            report = write_report(report_p, result.plan, result.graph)
    except OSError as exc:
        where = exc.filename or out
        raise SpindleError(f"cannot export to {where}: {exc.strerror}") from None
    return Exported(
        plan=plan_p,
        trace=trace_p,
        report=report_p,
        spec=spec_p,
        command=reproduce_command(result, spec_p, bundle_p or plan_p),
        warnings=tuple(report.warnings),
        bundle=bundle_p,
    )
