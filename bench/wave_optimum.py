"""How far a plan's waves are from the best waves a long exact solve finds.

A plan above its lower bound is there for one of two reasons: the planner's search stopped
short of better waves, or no waves come closer (the bound, a relaxation, is below every
schedule). This separates the two where a solver can tell. For each case it plans as
``spindle plan`` does (default scheduler, memory enforced, the planner's time limit), rebuilds
the planning context under the plan's own levers (micro-batches, ZeRO stage, recompute), and
solves the wave MILP (``planner.improve.wave_milp``: which MetaOps run in which wave, on how many
devices, for how many layers, with precedence) over *every* allocation of every MetaOp, with one
spare wave, for ``--milp-seconds``, warm-started from the plan's own waves or, where they have less
compute, the scheduler's waves on compute alone (no objective, so no polish). The planner
gives its global MILP a fraction of a second and a few allocations around each MetaOp's level
optimum.
Both schedules are then placed and timed by the same step model, the MILP's after the local
search the planner runs on its own candidates (``planner.improve.polish``), so the iterations
compare:

- ``LP``: the LP bound on one pass's compute (``planner.bound.lp_bound``, no step floors);
- ``plan``/``start``/``MILP`` compute: one pass's waves, summed (what the MILP minimises);
- ``plan``/``MILP`` iteration: the placed step (transfers, gradient sync, losses, optimizer)
  after the relabeling passes ``spindle plan`` runs on its pick
  (``relabel.relabel_and_spread``), which can land a little off the plan's reported
  iteration, given beside it as ``reported`` (its relabelings are searched among a round's
  candidates);
- ``plan/bnd``, ``MILP/bnd``: each iteration over the plan's reported lower bound.

Where the MILP ends where it started (status ``feasible``, its compute the start's), the
solver found nothing better in the time: that says nothing about the optimum, only that a
better schedule is not easy to find. Planning and solving are time-limited and run-to-run
spread applies (the MILP's incumbent depends on when the time runs out).

    .venv/bin/python bench/wave_optimum.py [CASE@N ...] [--milp-seconds S] [--time-limit S]

CASE is a spec under ``../shared/spec`` or ``bench/specs`` (``qwen_val`` takes its
``pretrain`` mix); the default cases are Table 4's rows above 1.10x its bound.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from spindle_dsl.cost import make_cost_model  # noqa: E402
from spindle_dsl.language import compile_file  # noqa: E402
from spindle_dsl.planner import DEFAULT_TIME_LIMIT_S  # noqa: E402
from spindle_dsl.planner.bound.lp_bound import lp_bound  # noqa: E402
from spindle_dsl.planner.evaluate.build import context, evaluate  # noqa: E402
from spindle_dsl.planner.evaluate.relabel import relabel_and_spread  # noqa: E402
from spindle_dsl.planner.improve.polish import polish  # noqa: E402
from spindle_dsl.planner.improve.wave_milp import WaveModelSpec, solve_waves  # noqa: E402
from spindle_dsl.planner.model.levers import Levers  # noqa: E402
from spindle_dsl.planner.model.problem import Piece, Problem, Schedule  # noqa: E402
from spindle_dsl.planner.search.make import make_plan  # noqa: E402
from spindle_dsl.planner.search.rounds import (  # noqa: E402
    _compute_cap,
    milp_schedule,
    round_key,
)
from spindle_dsl.planner.solver.choice import SolverChoice  # noqa: E402

SPECS = (ROOT.parent / "shared" / "spec", ROOT / "bench" / "specs")
MIXES = {"qwen_val": "pretrain"}
DEFAULT_CASES = (
    "flamingo_like@16",
    "flamingo_like@64",
    "clip10@64",
    "encdec7@32",
    "encdec7@128",
    "ofasys_7task@16",
    "ofasys_7task@64",
)
POLISH_S = 2.0  # the local search on the MILP's waves (the planner's own gets less)


def spec_path(name: str) -> Path:
    for folder in SPECS:
        path = folder / f"{name}.spindle"
        if path.exists():
            return path
    raise SystemExit(f"no spec {name}.spindle under {', '.join(str(f) for f in SPECS)}")


def every_allocation(problem: Problem, *used: Schedule) -> tuple[tuple[int, ...], ...]:
    """Each op's pareto allocations within the devices, and any of ``used`` uses."""
    seen: dict[str, set[int]] = {}
    for sched in used:
        for wave in sched.waves:
            for p in wave:
                seen.setdefault(p.op, set()).add(p.n)
    return tuple(
        tuple(sorted({n for n in o.pareto if n <= problem.devices} | seen.get(o.id, set())))
        for o in problem.ops
    )


def row(case: str, milp_s: float, time_limit: float) -> dict:
    name, _, n = case.partition("@")
    graph = compile_file(
        spec_path(name), mix=MIXES.get(name), cluster_overrides={"devices": int(n)}
    ).graph
    cost = make_cost_model(graph.cluster)
    plan = make_plan(graph, cost, time_limit_s=time_limit)
    levers = Levers(
        plan.micro_batches,
        plan.zero_stage,
        frozenset(m.id for m in plan.metaops if m.recompute),
    )
    ctx = context(graph, cost, levers, enforce=True)
    problem = ctx.problem
    mine = Schedule(
        "plan",
        tuple(
            tuple(Piece(e.metaop, e.first, e.end, len(e.devices)) for e in w.entries)
            for w in plan.waves
        ),
    )
    # the warm start: the plan's waves or, if less compute, the scheduler's waves on compute
    # alone (the plan's were polished on the whole step, which may trade compute away)
    lean = milp_schedule(problem, time_limit)
    start = min((mine, lean), key=lambda s: s.compute_s(problem))
    waves = max(len(mine.waves), len(lean.waves)) + 1
    spec = WaveModelSpec(
        problem.ops,
        problem.devices,
        waves,
        every_allocation(problem, mine, lean),
        (*start.waves, *((),) * (waves - len(start.waves))),
        lanes=problem.lanes,
    )
    t0 = time.perf_counter()
    res = solve_waves(spec, milp_s, SolverChoice())
    wall = time.perf_counter() - t0

    def objective(s: Schedule) -> tuple[float, float]:
        return round_key(evaluate(ctx, s), ctx, True)

    found = Schedule("milp", res.waves) if res.waves else start
    polished = polish(problem, found, objective, POLISH_S, _compute_cap(problem))
    k = plan.micro_batches
    lp = lp_bound(problem, micro_batches=k)
    return {
        "case": name,
        "n": int(n),
        "k": k,
        "lp": lp.lower_bound_s / k,
        "plan_c": mine.compute_s(problem),
        "start_c": start.compute_s(problem),
        "milp_c": found.compute_s(problem),
        "status": res.status.value,
        "wall": wall,
        "plan_it": relabel_and_spread(ctx, evaluate(ctx, mine)).iteration_s,
        "milp_it": relabel_and_spread(ctx, evaluate(ctx, polished)).iteration_s,
        "reported": plan.iteration_s,
        "bound": plan.lower_bound_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", default=list(DEFAULT_CASES))
    parser.add_argument("--milp-seconds", type=float, default=60.0)
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S)
    args = parser.parse_args(argv)
    head = (
        f"{'workload':<16}{'N':>5}{'k':>3}{'LP ms':>9}{'plan ms':>9}{'start ms':>9}{'MILP ms':>9}"
        f"{'status':>10}{'solve s':>8}{'plan it':>10}{'MILP it':>10}{'reported':>10}"
        f"{'bound':>9}{'plan/bnd':>9}{'MILP/bnd':>9}"
    )
    print("compute of one pass (LP, plan, MILP), iterations placed and timed alike, ms")
    print(head)
    for case in args.cases:
        r = row(case, args.milp_seconds, args.time_limit)
        ms = {k: v * 1e3 for k, v in r.items() if isinstance(v, float) and k != "wall"}
        print(
            f"{r['case']:<16}{r['n']:>5}{r['k']:>3}{ms['lp']:>9.1f}{ms['plan_c']:>9.1f}{ms['start_c']:>9.1f}"
            f"{ms['milp_c']:>9.1f}{r['status']:>10}{r['wall']:>8.1f}{ms['plan_it']:>10.1f}"
            f"{ms['milp_it']:>10.1f}{ms['reported']:>10.1f}{ms['bound']:>9.1f}"
            f"{r['plan_it'] / r['bound']:>9.2f}{r['milp_it'] / r['bound']:>9.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
