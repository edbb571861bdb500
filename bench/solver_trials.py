"""Crash trials for the MILP solvers: how often does planning die of a native solver crash?

    .venv/bin/python bench/solver_trials.py --solver cbc --isolate 0 --processes 20
    .venv/bin/python bench/solver_trials.py --solver highs --isolate 0 --processes 20
    .venv/bin/python bench/solver_trials.py --solver cbc --isolate 1 --processes 20

Each trial process plans ``--plans`` configurations in a row (qwen_val and multitask_clip on
32/64 devices, memory check off), drawn at random with random time limits from 0.05 to 3 s,
in one Python process: a crash inside a solver library leaves some of its state behind and
depends on timing, so a varied sequence in one process provokes it far more often than one
``spindle plan`` per process. The table counts processes killed by a signal (what a user
would see as a core dump), plans completed, and solver crashes the isolation turned into
warnings. ``--isolate 1`` runs every solve in the worker process (the default of the
planner), ``0`` in the planning process itself.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = HERE.parent.parent / "shared" / "spec"
CONFIGS = [
    ("qwen_val", None, 64),
    ("qwen_val", "audio_heavy", 64),
    ("qwen_val", None, 32),
    ("multitask_clip", None, 64),
    ("multitask_clip", None, 32),
]
LIMITS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0)


def worker(seed: int, plans: int, solver: str) -> int:
    """One trial process: ``plans`` plans in a row; prints one line per finished plan."""
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.language import compile_file
    from spindle_dsl.planner import make_plan
    from spindle_dsl.planner.solver.isolate import SolverCrashWarning

    rng = random.Random(seed)
    graphs = []
    for name, mix, n in CONFIGS:
        g = compile_file(SPEC / f"{name}.spindle", mix=mix, cluster_overrides={"devices": n})
        graphs.append(g.graph)
    for _ in range(plans):
        g = rng.choice(graphs)
        limit = rng.choice(LIMITS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SolverCrashWarning)
            plan = make_plan(
                g,
                make_cost_model(g.cluster),
                time_limit_s=limit,
                check_memory=False,
                solver=solver,
            )
        crashes = sum(issubclass(w.category, SolverCrashWarning) for w in caught)
        print(f"plan {plan.iteration_s:.6f} crashes {crashes}", flush=True)
    return 0


def trials(solver: str, isolate: bool, processes: int, plans: int, first_seed: int) -> None:
    env = dict(os.environ, SPINDLE_SOLVER_ISOLATE="1" if isolate else "0")
    killed, done, warned = 0, 0, 0
    signals: dict[str, int] = {}
    t0 = time.perf_counter()
    for seed in range(first_seed, first_seed + processes):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            str(seed),
            "--plans",
            str(plans),
            "--solver",
            solver,
        ]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("plan ")]
        done += len(lines)
        warned += sum(int(ln.split()[-1]) for ln in lines)
        if r.returncode < 0:
            killed += 1
            name = signal.Signals(-r.returncode).name
            signals[name] = signals.get(name, 0) + 1
        elif r.returncode != 0:
            print(f"seed {seed}: exit {r.returncode}\n{r.stderr[-2000:]}", file=sys.stderr)
    sig = ", ".join(f"{k} x{v}" for k, v in signals.items()) or "-"
    print(
        f"solver {solver:<5} isolate {int(isolate)}: {processes} processes x {plans} plans: "
        f"{killed} killed ({sig}), {done} plans done, {warned} solver crashes caught "
        f"({time.perf_counter() - t0:.0f} s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solver", default="cbc", choices=("highs", "cbc"))
    parser.add_argument("--isolate", type=int, default=0, choices=(0, 1))
    parser.add_argument("--processes", type=int, default=20)
    parser.add_argument("--plans", type=int, default=8)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not SPEC.is_dir():
        print(f"{SPEC} is absent: the fixtures live in the shared folder", file=sys.stderr)
        return 1
    if args.worker is not None:
        return worker(args.worker, args.plans, args.solver)
    trials(args.solver, bool(args.isolate), args.processes, args.plans, args.first_seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
