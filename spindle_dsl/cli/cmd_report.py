"""``spindle report``: one self-contained HTML page about a plan (made from a spec, or read
from a plan file): summary, pictures, wave table, baselines and memory per device. A spec with
a schedule (or a plan bundle) gets every phase's plan, with the phases on a timeline of
training steps."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spindle_dsl.cli.cmd_render import add_input_arguments, is_plan_file, load_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser)
    parser.add_argument(
        "-o", "--output", metavar="FILE", default="report.html", help="default: report.html"
    )
    parser.add_argument("--plan-out", metavar="PLAN.json", help="also write the plan it shows")
    parser.add_argument(
        "--measured",
        metavar="TRACE.json",
        help="a measured trace of a run of this plan (spindle train --trace): drawn under the "
        "predicted timeline, with the prediction's largest misses",
    )


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.render.measured import load_trace
    from spindle_dsl.render.report import write_report

    measured = load_trace(args.measured) if args.measured else None
    plan, graph = load_plan_or_bundle(args)
    if args.plan_out:
        plan.write(args.plan_out)
    report = write_report(args.output, plan, graph, measured)
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    size = Path(args.output).stat().st_size
    print(f"wrote {args.output} ({size / 1024:.0f} KiB)")
    return 0


def load_plan_or_bundle(args: argparse.Namespace):  # -> (Plan | PlanBundle, graph(s) | None)
    """``load_plan``, except that a plan bundle is read whole and a spec with a schedule is
    planned phase by phase (with each mix's MetaGraph, for the pictures)."""
    if is_plan_file(args.spec):
        from spindle_dsl.plan.bundle import read_plan_file

        return read_plan_file(args.spec), None
    from spindle_dsl.cli.common import load_compiled

    compiled = load_compiled(args, show_warnings=False)
    if compiled.schedule is None:
        return load_plan(args)  # (compiles again, showing the warnings: milliseconds)
    if compiled.warnings:
        print(compiled.render_warnings(), file=sys.stderr)
    from spindle_dsl.cli.plan_phases import plan_bundle

    bundle = plan_bundle(args, compiled.schedule)
    return bundle, {p.mix: p.graph for p in compiled.schedule.phases}
