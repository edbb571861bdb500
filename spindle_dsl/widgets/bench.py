"""How long a slider move takes: re-plan and redraw times of the planner widget's session.

    python -m spindle_dsl.widgets.bench examples/*.spindle
    python -m spindle_dsl.widgets.bench examples/qwen_val.spindle --no-check-memory

For every spec and device count it moves the "devices slider" of a fresh session (so nothing
is cached) and reports the median over ``--repeat`` rounds of the stages the move ran: compile,
plan, draw. The widget's budget is 0.5 s per move; this is the measurement behind that claim.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from spindle_dsl.errors import SpindleError
from spindle_dsl.widgets.pipeline import real_pipeline
from spindle_dsl.widgets.state import INTERACTIVE_TIME_LIMIT_S, PlanningSession, Settings, Timings

DEVICES = (2, 4, 8, 16, 32, 64)


def bench_spec(
    path: Path, devices: tuple[int, ...], repeat: int, check_memory: bool
) -> list[tuple[int, list[Timings], str]]:
    """Per device count: the timings of each round and what the view showed."""
    text = path.read_text()
    pipeline = real_pipeline()
    rows: dict[int, list[Timings]] = {n: [] for n in devices}
    outcome: dict[int, str] = {}
    for _ in range(repeat):
        session = PlanningSession(
            pipeline, Settings(text=text, path=str(path), check_memory=check_memory)
        )
        for n in devices:
            view = session.update(devices=n)
            rows[n].append(view.timings)
            if view.ok:
                p = view.result.plan
                outcome[n] = f"{p.iteration_s:.4g} s ({p.solver.name})"
            else:
                outcome[n] = "no plan: " + (view.error or "").splitlines()[0][:60]
    return [(n, rows[n], outcome[n]) for n in devices]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spindle_dsl.widgets.bench")
    parser.add_argument("specs", nargs="+", type=Path)
    parser.add_argument("--devices", type=int, nargs="+", default=list(DEVICES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-check-memory", action="store_true")
    args = parser.parse_args(argv)
    print(f"planner time limit {INTERACTIVE_TIME_LIMIT_S} s; medians of {args.repeat} rounds")
    print(f"{'spec':18} {'dev':>4} {'total':>7} {'compile':>8} {'plan':>7} {'draw':>7}  result")
    worst = 0.0
    for path in args.specs:
        try:
            rows = bench_spec(path, tuple(args.devices), args.repeat, not args.no_check_memory)
        except (OSError, SpindleError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 1
        for n, timings, outcome in rows:
            med = {
                k: statistics.median(getattr(t, k) for t in timings)
                for k in ("total_s", "compile_s", "plan_s", "draw_s")
            }
            worst = max(worst, med["total_s"])
            print(
                f"{path.stem:18} {n:4} {med['total_s']:7.3f} {med['compile_s']:8.3f} "
                f"{med['plan_s']:7.3f} {med['draw_s']:7.3f}  {outcome}"
            )
    print(f"slowest median re-plan: {worst:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
