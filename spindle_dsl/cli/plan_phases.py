"""``spindle plan`` on a spec with a ``schedule``: a plan per phase, written as one bundle.

The commands that plan (``plan``, ``report``, ``train``) call ``plan_bundle`` when the spec has
a schedule; ``spindle plan`` then prints each phase's wave table (unless ``--quiet``) and one
table of the phases: their steps, mix, predicted iteration time, speed-up over the sequential
baseline, peak memory per device and planning time. ``--out`` writes the bundle
(``docs/plan-bundle.md``); ``--svg``/``--trace`` write one file per phase, ``NAME-phaseK.EXT``.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from spindle_dsl.phases import MixSchedule
from spindle_dsl.plan.bundle import PlanBundle


def add_jobs_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="helper processes planning beside this one: with a schedule, its phases "
        "(default: one per phase but the first, at most the spare cores), else the runner-up "
        "lever settings' rounds (default: one per spare core and runner-up); 0: none",
    )


def plan_bundle(args: argparse.Namespace, schedule: MixSchedule) -> PlanBundle:
    """Every phase planned with the command line's options (a forced lever, ``--micro-batches``
    or ``--zero-stage``, in every phase); solver crashes become warnings on stderr, as for one
    plan."""
    from spindle_dsl.planner.search.phases import plan_schedule
    from spindle_dsl.planner.solver.isolate import SolverCrashWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SolverCrashWarning)
        bundle = plan_schedule(
            schedule,
            profile=getattr(args, "profile", None),
            scheduler=args.scheduler,
            time_limit_s=args.time_limit,
            check_memory=not getattr(args, "no_memory_check", False),
            solver=getattr(args, "solver", None),
            jobs=getattr(args, "jobs", None),
            micro_batches=getattr(args, "micro_batches", None),
            zero_stage=getattr(args, "zero_stage", None),
            tp=getattr(args, "tp", None),
        )
    for w in caught:
        if issubclass(w.category, SolverCrashWarning):
            print(f"warning: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return bundle


def phase_rows(bundle: PlanBundle) -> list[dict[str, Any]]:
    """Each phase's steps and mix with its plan's summary (``cmd_plan.summary``)."""
    from spindle_dsl.cli.cmd_plan import summary

    rows = []
    for i, p in enumerate(bundle.phases):
        last = bundle.phases[i + 1].first_step - 1 if i + 1 < len(bundle.phases) else None
        rows.append({"phase": i + 1, "first_step": p.first_step, "last_step": last,
                     **summary(p.plan)})  # fmt: skip
    return rows


def phase_table(rows: list[dict[str, Any]]) -> str:
    from spindle_dsl.render.fmt import fmt_bytes, fmt_seconds

    header = (
        f"{'phase':>5}  {'steps':<9} {'mix':<16} {'iteration':>10} {'sequential':>10} "
        f"{'speed-up':>8}  {'peak memory':>11}  {'waves':>5}  {'planned in':>10}"
    )
    lines = [header]
    for r in rows:
        steps = f"{r['first_step']}-{'' if r['last_step'] is None else r['last_step']}"
        seq = r["baselines"].get("sequential_s")
        speedup = f"{seq / r['iteration_s']:.2f}x" if seq else "-"
        lines.append(
            f"{r['phase']:>5}  {steps:<9} {r['mix']:<16} {fmt_seconds(r['iteration_s']):>10} "
            f"{fmt_seconds(seq) if seq else '-':>10} {speedup:>8}  "
            f"{fmt_bytes(r['peak_memory_bytes']):>11}  {r['waves']:>5}  "
            f"{r['planning_s']:>9.2f}s"
        )
    return "\n".join(lines)


def run_scheduled(args: argparse.Namespace, schedule: MixSchedule) -> int:
    """The body of ``spindle plan`` for a scheduled spec."""
    from spindle_dsl.cli.cmd_plan import wave_table

    bundle = plan_bundle(args, schedule)
    rows = phase_rows(bundle)
    planning = bundle.planning
    if args.json:
        print(json.dumps({"phases": rows, "planning": planning}, indent=1))
    else:
        if not args.quiet:
            for r, p in zip(rows, bundle.phases, strict=True):
                print(f"phase {r['phase']}: mix {p.mix} from step {p.first_step}")
                print(wave_table(p.plan))
                print()
        first = bundle.phases[0].plan
        print(
            f"plan: {bundle.spec.path}, {len(rows)} phases on {first.cluster.devices} x "
            f"{first.cluster.device} (steps counted from 0, as in the schedule block)"
        )
        print(phase_table(rows))
        print(
            f"planning: {planning['plans']} plans in {planning['wall_s']:.2f} s, "
            f"{planning['worker_processes']} helper processes beside this one"
            + (
                f"; {planning['phases_sharing_a_plan']} phases share a plan"
                if planning["phases_sharing_a_plan"]
                else ""
            )
        )
        for r in rows:
            for n in r["notes"]:
                print(f"note: phase {r['phase']}: {n}")
    if args.out:
        bundle.write(args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return write_phase_outputs(args, bundle)


def phase_path(path: str, phase: int) -> str:
    """``waves.svg`` -> ``waves-phase2.svg``: a phase's own file beside the named one."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}-phase{phase}{p.suffix}"))


def write_phase_outputs(args: argparse.Namespace, bundle: PlanBundle) -> int:
    """``--svg``/``--trace`` for every phase, each to its own file."""
    if not (getattr(args, "svg", None) or getattr(args, "trace", None)):
        return 0
    from spindle_dsl.cli.cmd_render import write_plan_outputs

    code = 0
    for i, p in enumerate(bundle.phases, start=1):
        named = argparse.Namespace(
            svg=phase_path(args.svg, i) if getattr(args, "svg", None) else None,
            trace=phase_path(args.trace, i) if getattr(args, "trace", None) else None,
        )
        code = max(code, write_plan_outputs(named, p.plan))
    return code
