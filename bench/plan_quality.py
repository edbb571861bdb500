"""Plan quality and planning time: every scheduler and baseline on the paper's workloads.

    .venv/bin/python bench/plan_quality.py [--time-limit S] [--solver highs|cbc] [--skip-sweep]
    .venv/bin/python bench/plan_quality.py --solvers highs,cbc [--repeat K] [--skip-sweep]

Table 1: multitask_clip at 8/16/32/64 devices and qwen_val at 16/32/64 devices (both mixes),
with the analytic cost model: the predicted iteration time (transfers and gradient sync
included) of the default plan and of every candidate, the default's speed-ups, its compute
(sum of wave durations) over the sum of MetaLevel continuous optima, whether it fits in
memory, and the planning time. Memory is not enforced here (``check_memory=False``: the
point is to compare schedules); the column says which plans fit. The checks column holds
the issue's targets: never slower than a baseline or the paper's plan, compute at most
1.05 x the continuous reference, planning under 3 s.

``--solvers a,b``: the same rows side by side for each MILP solver instead (default plan's
iteration time, compute ratio and planning time), each the median of ``--repeat`` runs, the
spread in brackets: the MILPs are time-limited, so a plan can vary with machine load.

Table 2: planning time of the default scheduler on generated specs up to 65,536 devices and
50 tasks (``bench/synthetic_spec.py``); ``bench/scale.py`` adds peak memory and the 7-task
OFASys-like job.

Table 3: the same workloads planned as ``spindle plan`` plans them, with memory enforced: the
distributed optimizer and per-MetaOp activation recompute where needed. It prints the default
plan's iteration time, its speed-up over the sequential baseline planned under the same
recompute choices, how many MetaOps recompute, and the peak memory per device, or why no plan
fits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from synthetic_spec import synthetic_spec  # noqa: E402

from spindle_dsl.cost import make_cost_model  # noqa: E402
from spindle_dsl.errors import PlanError  # noqa: E402
from spindle_dsl.language import compile_file, compile_text  # noqa: E402
from spindle_dsl.planner import DEFAULT_TIME_LIMIT_S, make_plan  # noqa: E402

SPEC = HERE.parent.parent / "shared" / "spec"
CONFIGS = [("multitask_clip", None, n) for n in (8, 16, 32, 64)] + [
    ("qwen_val", mix, n) for mix in ("pretrain", "audio_heavy") for n in (16, 32, 64)
]
SWEEP = [
    (64, 10), (128, 20), (256, 30), (512, 40), (1024, 50), (4096, 50), (16384, 50), (65536, 50)
]  # fmt: skip
PAPER = (
    "paper (arXiv 2409.03365): up to 1.71x over DeepSpeed and 1.67x over Megatron-LM; "
    "QWen-VAL 1.16x at 32 and 1.63x at 64 GPUs"
)
NAMES = ("milp", "paper", "sequential", "distmm", "optimus")
COMPUTE_TARGET = 1.05
PLAN_S_TARGET = 3.0


def plan_row(graph, time_limit: float, solver: str | None = None) -> dict:
    cost = make_cost_model(graph.cluster)
    t0 = time.perf_counter()
    plan = make_plan(graph, cost, time_limit_s=time_limit, check_memory=False, solver=solver)
    wall = time.perf_counter() - t0
    cands = plan.extra["candidates_s"]
    compute = dict(plan.breakdown)["compute_s"]
    return {
        "it": plan.iteration_s,
        "chosen": plan.solver.name,
        "cands": cands,
        "compute_ratio": compute / plan.extra["level_reference_s"],
        "fits": max(plan.memory_bytes) <= plan.cluster.memory_bytes,
        "wall": wall,
        "metaops": len(plan.metaops),
        "notes": plan.extra.get("solver_notes", []),
    }


def checks(r: dict) -> list[str]:
    """The issue's targets for one default plan (see the module docstring)."""
    never_slower = all(r["it"] <= v * (1 + 1e-9) for v in r["cands"].values())
    return [
        "<=all" if never_slower else "SLOWER",
        f"<={COMPUTE_TARGET}C" if r["compute_ratio"] <= COMPUTE_TARGET else f">{COMPUTE_TARGET}C",
        f"<{PLAN_S_TARGET:g}s" if r["wall"] < PLAN_S_TARGET else f">={PLAN_S_TARGET:g}s",
    ]


def _graph(name: str, mix: str | None, n: int):
    return compile_file(SPEC / f"{name}.spindle", mix=mix, cluster_overrides={"devices": n}).graph


def table1(time_limit: float, solver: str | None) -> list[dict]:
    head = (
        f"{'workload':<26} {'N':>4} {'default':>9} "
        + " ".join(f"{n:>10}" for n in NAMES)
        + f" {'x seq':>6} {'x dmm':>6} {'x opt':>6} {'x ppr':>6} {'comp/C':>7} {'fits':>5}"
        f" {'plan s':>7}  checks"
    )
    print(f"Table 1: predicted iteration time in ms (analytic cost model, solver {solver or '-'})")
    print(head)
    rows = []
    for name, mix, n in CONFIGS:
        r = plan_row(_graph(name, mix, n), time_limit, solver)
        c = r["cands"]
        label = f"{name}{'/' + mix if mix else ''}"
        crashed = any(x.startswith("warning:") for x in r["notes"])
        print(
            f"{label:<26} {n:>4} {r['it'] * 1e3:>9.1f} "
            + " ".join(f"{c[k] * 1e3:>10.1f}" for k in NAMES)
            + f" {c['sequential'] / r['it']:>6.2f} {c['distmm'] / r['it']:>6.2f}"
            f" {c['optimus'] / r['it']:>6.2f} {c['paper'] / r['it']:>6.2f}"
            f" {r['compute_ratio']:>7.3f} {'yes' if r['fits'] else 'no':>5} {r['wall']:>7.2f}"
            f"  {' '.join(checks(r))}  [{r['chosen']}]{' SOLVER CRASHED' if crashed else ''}"
        )
        rows.append(r)
    print(PAPER)
    return rows


def _cell(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


def solver_table(solvers: list[str], time_limit: float, repeat: int) -> None:
    """The default plan per workload and solver, side by side (medians of ``repeat`` runs)."""
    print(f"Solvers side by side: default plan, median [min-max] of {repeat} run(s)")
    print(f"{'workload':<26} {'N':>4} " + " | ".join(f"{s:^44}" for s in solvers))
    print(
        f"{'':<26} {'':>4} "
        + " | ".join(f"{'iter ms':>18} {'comp/C':>13} {'plan s':>11}" for _ in solvers)
    )
    for name, mix, n in CONFIGS:
        graph = _graph(name, mix, n)
        cells = []
        for s in solvers:
            rs = [plan_row(graph, time_limit, s) for _ in range(repeat)]
            crashed = sum(any(x.startswith("warning:") for x in r["notes"]) for r in rs)
            ok = all(all(c.startswith("<") for c in checks(r)[:2]) for r in rs)
            cells.append(
                f"{_cell([r['it'] * 1e3 for r in rs], '.1f'):>18}"
                f" {_cell([r['compute_ratio'] for r in rs], '.3f'):>13}"
                f" {_cell([r['wall'] for r in rs], '.2f'):>11}"
                + ("" if ok else " !")
                + (f" crashed x{crashed}" if crashed else "")
            )
        label = f"{name}{'/' + mix if mix else ''}"
        print(f"{label:<26} {n:>4} " + " | ".join(cells), flush=True)
    print("! = a run missed a target (slower than a candidate, or compute above 1.05 C)")


def table2(time_limit: float, solver: str | None) -> None:
    print("\nTable 2: planning time of the default scheduler on generated specs")
    sys.stdout.flush()
    print(
        f"{'devices':>8} {'tasks':>6} {'MetaOps':>8} {'plan s':>8} {'default ms':>11}"
        f" {'paper ms':>9} {'x seq':>6}  chosen"
    )
    for n, t in SWEEP:
        graph = compile_text(synthetic_spec(n, t), path=f"<synthetic {n}x{t}>").graph
        r = plan_row(graph, time_limit, solver)
        c = r["cands"]
        print(
            f"{n:>8} {t:>6} {r['metaops']:>8} {r['wall']:>8.2f} {r['it'] * 1e3:>11.1f}"
            f" {c['paper'] * 1e3:>9.1f} {c['sequential'] / r['it']:>6.2f}  {r['chosen']}",
            flush=True,
        )


def table3(time_limit: float, solver: str | None) -> None:
    print("\nTable 3: with memory enforced (as `spindle plan` plans)")
    print(
        f"{'workload':<26} {'N':>4} {'default ms':>11} {'x seq':>6} {'recompute':>10}"
        f" {'peak GiB':>9} {'of GiB':>7} {'plan s':>7}"
    )
    for name, mix, n in CONFIGS:
        graph = _graph(name, mix, n)
        label = f"{name}{'/' + mix if mix else ''}"
        t0 = time.perf_counter()
        try:
            plan = make_plan(
                graph, make_cost_model(graph.cluster), time_limit_s=time_limit, solver=solver
            )
        except PlanError as exc:
            reason = exc.errors[0].message if exc.errors else str(exc)
            print(f"{label:<26} {n:>4}  no plan fits: {reason[:110]}")
            continue
        wall = time.perf_counter() - t0
        seq = plan.extra["candidates_s"]["sequential"]
        rc = sum(m.recompute for m in plan.metaops)
        print(
            f"{label:<26} {n:>4} {plan.iteration_s * 1e3:>11.1f} {seq / plan.iteration_s:>6.2f}"
            f" {f'{rc}/{len(plan.metaops)}':>10} {max(plan.memory_bytes) / 2**30:>9.1f}"
            f" {plan.cluster.memory_bytes / 2**30:>7.1f} {wall:>7.2f}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S)
    parser.add_argument("--solver", help="MILP solver (default: the planner's default)")
    parser.add_argument("--solvers", help="comma-separated solvers to compare side by side")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell with --solvers")
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-memory", action="store_true", help="leave out Table 3")
    args = parser.parse_args()
    if not SPEC.is_dir():
        print(f"{SPEC} is absent: the fixtures live in the shared folder", file=sys.stderr)
        return 1
    if args.solvers:
        solver_table([s.strip() for s in args.solvers.split(",")], args.time_limit, args.repeat)
    else:
        table1(args.time_limit, args.solver)
    if not args.skip_sweep:
        table2(args.time_limit, args.solver)
    if not args.skip_memory:
        table3(args.time_limit, args.solver)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
