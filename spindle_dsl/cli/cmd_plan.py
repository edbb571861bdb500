"""``spindle plan``: make a wave plan, print it as a table and a summary, write it as JSON.

The table lists each wave's entries (MetaOp, layer range, device ids; one micro-batch pass);
the summary gives the predicted iteration time and its parts, the speed-up over each baseline
(each tuned with the same memory levers), the ratio to the proven lower bound, the memory
levers the plan pulls (micro-batches, ZeRO stage, recompute), the peak memory per device
against capacity and the planning time. ``--micro-batches`` and ``--zero-stage`` force a
lever. ``--json`` prints the summary
as JSON instead (for scripts), ``--out`` writes the plan file atomically. ``--solver``
picks the MILP solver (HiGHS by default, CBC on request); a solver crash is printed as a
warning and planning goes on with the best plan found before it. A spec with a ``schedule``
gets a plan per phase, written as one plan bundle (``cli/plan_phases.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

from spindle_dsl.cli.calibration import (
    Calibration,
    add_cache_argument,
    calibrate_plan,
    uncalibrated_text,
)
from spindle_dsl.cli.common import (
    add_spec_arguments,
    add_tp_argument,
    load_compiled,
    load_cost_model,
)
from spindle_dsl.cli.plan_phases import add_jobs_argument, run_scheduled
from spindle_dsl.plan.model import Plan
from spindle_dsl.render.gap import gap_text

GiB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from spindle_dsl.planner import DEFAULT_TIME_LIMIT_S, SCHEDULERS

    add_spec_arguments(parser)
    add_cache_argument(parser)
    parser.add_argument(
        "--scheduler",
        default="default",
        choices=SCHEDULERS,
        help="default keeps the fastest of milp, paper and the baselines (default: %(default)s)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        metavar="S",
        help="time budget in seconds, counted from the command's start: the search returns "
        "the best plan found by then (default: %(default)s)",
    )
    parser.add_argument(
        "--solver",
        type=str.lower,
        choices=("highs", "cbc"),
        default=None,
        help="MILP solver for the milp scheduler (default: $SPINDLE_SOLVER, else highs); "
        "solves run in a separate process, so a solver crash only costs that solve "
        "(SPINDLE_SOLVER_ISOLATE=0 solves in-process)",
    )
    add_tp_argument(parser)
    parser.add_argument(
        "--micro-batches",
        type=_at_least_one,
        default=None,
        metavar="K",
        help="run the waves K times per iteration, each on 1/K of every task's batch "
        "(gradient accumulation); default: the planner chooses K with the other memory levers",
    )
    parser.add_argument(
        "--zero-stage",
        type=int,
        choices=(0, 1, 2),
        default=None,
        help="shard optimizer state (1) and gradients too (2) over the devices holding each "
        "parameter part, or nothing (0); default: the planner chooses 1 or 2",
    )
    parser.add_argument(
        "--no-memory-check",
        action="store_true",
        help="plan even if the plan does not fit in device memory (it is noted in the plan, "
        "and `spindle validate` reports it)",
    )
    add_jobs_argument(parser)
    parser.add_argument(
        "--out", metavar="PLAN.json", help="write the plan (a spec with a schedule: the bundle)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--quiet", action="store_true", help="print the summary only")
    try:
        from spindle_dsl.cli.cmd_render import add_plan_outputs
    except ImportError:  # the renderer is optional for planning
        return
    add_plan_outputs(parser)


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def devices_text(ds: tuple[int, ...]) -> str:
    """Device ids as compact ranges: (0, 1, 2, 5) -> '0-2,5' (whatever the shard order)."""
    out: list[str] = []
    start = prev = None
    for d in sorted(ds):
        if prev is not None and d == prev + 1:
            prev = d
            continue
        if start is not None:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = d
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out)


def wave_table(plan: Plan) -> str:
    """One line per entry, grouped by wave, times in milliseconds."""
    width = max((len(e.metaop) for w in plan.waves for e in w.entries), default=6)
    split = any(plan.layout_text(e) for w in plan.waves for e in w.entries)
    lines = [
        f"{'wave':>4} {'start ms':>10} {'dur ms':>9}  {'MetaOp':<{width}} {'layers':>9} "
        f"{'n':>4}{' dp x tp' if split else ''} {'time ms':>9}  devices"
    ]
    for w in plan.waves:
        for j, e in enumerate(w.entries):
            head = (
                f"{w.index:>4} {w.start_s * 1e3:>10.2f} {w.duration_s * 1e3:>9.2f}"
                if j == 0
                else " " * 25
            )
            lines.append(
                f"{head}  {e.metaop:<{width}} {f'{e.first}-{e.end - 1}':>9} "
                f"{len(e.devices):>4}{f' {plan.layout_text(e):>7}' if split else ''} "
                f"{e.time_s * 1e3:>9.2f}  {devices_text(e.devices)}"
            )
    return "\n".join(lines)


def summary(plan: Plan) -> dict[str, Any]:
    base = dict(plan.baselines)
    return {
        "spec": plan.spec.path,
        "mix": plan.spec.mix,
        "devices": plan.cluster.devices,
        "device": plan.cluster.device,
        "scheduler": plan.extra.get("scheduler", plan.solver.name),
        "milp_solver": next(
            (
                n.split(": ", 1)[1]
                for n in plan.extra.get("solver_notes", ())
                if n.startswith("solver: ")
            ),
            None,
        ),
        "chosen": plan.solver.name,
        "status": plan.solver.status,
        "gap": plan.solver.gap,
        "waves": len(plan.waves),
        "iteration_s": plan.iteration_s,
        **dict(plan.breakdown),
        "baselines": base,
        "speedup": {k.removesuffix("_s"): v / plan.iteration_s for k, v in base.items()},
        "baselines_overflow": plan.extra.get("baselines_overflow", []),
        "lower_bound_s": plan.lower_bound_s,
        "ratio_to_bound": plan.iteration_s / plan.lower_bound_s if plan.lower_bound_s else None,
        "busy_s": plan.busy_s(),
        "idle_share": plan.idle_share(),
        "over_lp": plan.over_lp(),  # (compute, busy) over the LP bound
        "gap_split": dict(plan.gap_split() or ()),  # iteration - bound, term by term
        "bounds": plan.extra.get("bounds", {}),
        "level_reference_s": plan.extra.get("level_reference_s"),
        "micro_batches": plan.micro_batches,
        "zero_stage": plan.zero_stage,
        "recompute": [m.id for m in plan.metaops if m.recompute],
        "loss_devices": {sink: list(ds) for sink, ds in plan.loss_devices},
        "metaops": len(plan.metaops),
        "peak_memory_bytes": max(plan.memory_bytes, default=0),
        "memory_bytes": list(plan.memory_bytes),
        "memory_capacity_bytes": plan.cluster.memory_bytes,
        "planning_s": plan.solver.wall_s,
        "notes": list(plan.notes),
    }


def bound_text(s: dict[str, Any]) -> str:
    """The bound, which one it is (the LP relaxation, or the area / critical-path bound when
    the plan has no LP figure), and the plan's ratio to it."""
    b = s.get("bounds") or {}
    kind = "LP relaxation" if b.get("lp_s") is not None else "area / critical path"
    if b.get("step_floor_s"):
        kind += f" + {b['step_floor_s'] * 1e3:.2f} ms of step floors (losses, optimizer)"
    other = (
        f"; area / critical path {b['area_path_s'] * 1e3:.2f} ms"
        if b.get("lp_s") is not None and b.get("area_path_s") is not None
        else ""
    )
    if b.get("lanes"):
        other += f"; the devices' work shared by {b['lanes']} core{'s' if b['lanes'] > 1 else ''}"
    return (
        f"{s['lower_bound_s'] * 1e3:.2f} ms ({kind}{other}); "
        f"iteration / bound = {s['ratio_to_bound']:.2f}x"
    )


def compute_split_text(s: dict[str, Any]) -> str | None:
    """Where the compute over the LP bound goes: the entries' device-seconds (what only
    allocations quicker per device-second lower) and the devices idle inside waves (what the
    waves' barriers leave; the LP has none). None without an LP figure or compute."""
    if not s.get("over_lp"):
        return None
    compute, busy = s["over_lp"]
    who = "cores" if (s.get("bounds") or {}).get("lanes") else "devices"
    return (
        f"compute {compute:.2f}x the LP bound: the entries run {busy:.2f}x the LP's"
        f" device-seconds, and the {who} sit idle inside waves {s['idle_share']:.1%} of"
        " the time"
    )


STEP_TERMS = (
    ("wave_overhead_s", "wave overhead"),
    ("loss_s", "losses"),
    ("optimizer_s", "optimizer"),
)


def summary_text(s: dict[str, Any]) -> str:
    gap = f", gap {s['gap']:.1%}" if s["gap"] is not None else ""
    lines = [
        f"plan: {s['spec']} (mix {s['mix'] or '-'}) on {s['devices']} x {s['device']}",
        f"scheduler: {s['scheduler']} -> {s['chosen']} ({s['status']}{gap}), {s['waves']} waves"
        + (f"; MILP solver {s['milp_solver']}" if s["milp_solver"] else ""),
        f"iteration: {s['iteration_s'] * 1e3:.2f} ms = compute {s.get('compute_s', 0) * 1e3:.2f}"
        f" + transfers {s.get('transfer_s', 0) * 1e3:.2f}"
        f" + gradient sync {s.get('grad_sync_s', 0) * 1e3:.2f}"
        + "".join(  # the step model's terms (cost.step), when the plan has them
            f" + {label} {s[key] * 1e3:.2f}" for key, label in STEP_TERMS if key in s
        ),
    ]
    for name, secs in s["baselines"].items():
        short = name.removesuffix("_s")
        against = (
            "no fitting plan found"
            if short in s.get("baselines_overflow", ())
            else f"speed-up {s['speedup'][short]:.2f}x"
        )
        lines.append(f"  vs {short:<11} {secs * 1e3:>10.2f} ms  {against}")
    if s["ratio_to_bound"] is not None:
        lines.append(f"lower bound: {bound_text(s)}")
    for line in (gap_text(s.get("gap_split") or {}), compute_split_text(s)):
        if line:
            lines.append(line)
    lines.append(
        f"memory levers: {s['micro_batches']} micro-batch{'es' if s['micro_batches'] > 1 else ''}"
        f" per iteration, ZeRO-{s['zero_stage']}, activation recompute on "
        f"{len(s['recompute'])} of {s['metaops']} MetaOps"
    )
    lines.append(memory_line(s["memory_bytes"], s["memory_capacity_bytes"]))
    lines.append(f"planning time: {s['planning_s']:.2f} s")
    lines.extend(f"note: {n}" for n in s["notes"])
    return "\n".join(lines)


def memory_line(memory: list[int], capacity: int) -> str:
    """Predicted peak per device against capacity: the fullest, the emptiest and the mean."""
    if not memory:
        return "peak memory: not predicted (the cost model prices no memory)"
    top = max(range(len(memory)), key=memory.__getitem__)
    mean = sum(memory) / len(memory)
    return (
        f"peak memory per device: {memory[top] / GiB:.1f} GiB on device {top} "
        f"({memory[top] / capacity:.0%} of {capacity / GiB:.1f} GiB), least "
        f"{min(memory) / GiB:.1f} GiB, mean {mean / GiB:.1f} GiB"
    )


def _print_plan(args: argparse.Namespace, plan: Plan, calibration: Calibration) -> None:
    """The wave table and the summary (or the summary as JSON), with the plain statement
    that a CPU cluster's prediction is uncalibrated where the analytic model priced it."""
    s = summary(plan)
    # why a CPU cluster's prediction is the analytic first guess (None: a profile priced it,
    # or the cluster is GPUs, priced by their presets)
    s["uncalibrated"] = calibration.uncalibrated
    if args.json:
        print(json.dumps(s, indent=1))
        return
    if not args.quiet:
        print(wave_table(plan))
        print()
    print(summary_text(s))
    if calibration.uncalibrated:
        print(uncalibrated_text(calibration, args.spec, plan.cluster.devices))


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.planner import make_plan
    from spindle_dsl.planner.search.helpers import has_rounds, helper_count
    from spindle_dsl.planner.search.helpers import start as start_helpers
    from spindle_dsl.planner.search.make import RUNNERS_UP
    from spindle_dsl.planner.solver.choice import choose_solver
    from spindle_dsl.planner.solver.isolate import SolverCrashWarning, warm_up

    solver = choose_solver(args.solver)  # a bad name or setting fails before any work
    helpers: tuple[str, ...] = ()
    if has_rounds(args.scheduler, not args.no_memory_check):
        # the helpers start while the spec compiles, so that their imports are done
        # before the search starts beside them; then the solver process (``warm_up``)
        helpers = start_helpers(helper_count(args.jobs, RUNNERS_UP))
    if solver.isolated and args.scheduler in ("default", "milp"):
        warm_up(after=helpers)
    compiled = load_compiled(args)
    if compiled.schedule is not None:
        calibration = calibrate_plan(args, [p.graph for p in compiled.schedule.phases])
        code = run_scheduled(args, compiled.schedule)
        if calibration.uncalibrated:
            out = sys.stderr if args.json else sys.stdout
            ranks = compiled.graph.cluster.devices
            print(uncalibrated_text(calibration, args.spec, ranks), file=out)
        return code
    graph = compiled.graph
    calibration = calibrate_plan(args, [graph])
    cost = load_cost_model(args, graph)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SolverCrashWarning)
        plan = make_plan(
            graph,
            cost,
            scheduler=args.scheduler,
            time_limit_s=args.time_limit,
            check_memory=not args.no_memory_check,
            solver=solver.name,
            micro_batches=args.micro_batches,
            zero_stage=args.zero_stage,
            jobs=args.jobs,
            started_at=getattr(args, "started", None),
        )
    for w in caught:
        if issubclass(w.category, SolverCrashWarning):
            print(f"warning: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    _print_plan(args, plan, calibration)
    if args.out:
        plan.write(args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    if getattr(args, "svg", None) or getattr(args, "trace", None):
        from spindle_dsl.cli.cmd_render import write_plan_outputs

        return write_plan_outputs(args, plan)
    return 0
