"""How long a slider move takes: re-plan and redraw times of the planner widget's session.

    python -m spindle_dsl.widgets.bench examples/*.spindle
    python -m spindle_dsl.widgets.bench examples/qwen_val.spindle --no-check-memory

For every spec and device count it moves the "devices slider" of a fresh session (so nothing
is cached) and reports the median over ``--repeat`` rounds of the stages the move ran: compile,
plan, draw. The widget's budget is 0.5 s per move; this is the measurement behind that claim.

``--follow`` also runs, after each move, the full search the widget runs behind it (in its
own process, as there) and reports how long it took (median) and how much slower the quick
plan shown first was than the full search's (worst round).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from spindle_dsl.errors import SpindleError
from spindle_dsl.widgets.pipeline import real_pipeline
from spindle_dsl.widgets.state import INTERACTIVE_TIME_LIMIT_S, PlanningSession, Settings, Timings

DEVICES = (2, 4, 8, 16, 32, 64)


@dataclass
class Row:
    """One device count's moves over the rounds."""

    timings: list[Timings] = field(default_factory=list)
    outcome: str = ""  # the plan shown (the last round's)
    full_s: list[float] = field(default_factory=list)  # the full search's seconds
    slower: list[float] = field(default_factory=list)  # the quick plan against the full's


def bench_spec(
    path: Path, devices: tuple[int, ...], repeat: int, check_memory: bool, follow: bool
) -> list[tuple[int, Row]]:
    """Per device count: the timings of each round and what the view showed."""
    text = path.read_text()
    pipeline = real_pipeline()
    rows = {n: Row() for n in devices}
    for _ in range(repeat):
        session = PlanningSession(
            pipeline, Settings(text=text, path=str(path), check_memory=check_memory)
        )
        for n in devices:
            view = session.update(devices=n)
            row = rows[n]
            row.timings.append(view.timings)
            if not view.ok:
                row.outcome = "no plan: " + (view.error or "").splitlines()[0][:60]
                continue
            quick = view.result.plan
            row.outcome = f"{quick.iteration_s:.4g} s ({quick.solver.name})"
            wanted = session.refinement()
            if follow and wanted is not None and pipeline.refine is not None:
                start = time.perf_counter()
                full = pipeline.refine(wanted.graph, wanted.options)
                row.full_s.append(time.perf_counter() - start)
                best = session.adopt(wanted, full).result.plan.iteration_s
                row.slower.append(quick.iteration_s / best - 1)
    return [(n, rows[n]) for n in devices]


def _followed(row: Row) -> str:
    if not row.full_s:
        return ""
    return (
        f"  full search {statistics.median(row.full_s):.1f} s, shown +{100 * max(row.slower):.1f}%"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spindle_dsl.widgets.bench")
    parser.add_argument("specs", nargs="+", type=Path)
    parser.add_argument("--devices", type=int, nargs="+", default=list(DEVICES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-check-memory", action="store_true")
    parser.add_argument("--follow", action="store_true", help="time the full search too")
    args = parser.parse_args(argv)
    print(f"planner time limit {INTERACTIVE_TIME_LIMIT_S} s; medians of {args.repeat} rounds")
    print(f"{'spec':18} {'dev':>4} {'total':>7} {'compile':>8} {'plan':>7} {'draw':>7}  result")
    worst = 0.0
    for path in args.specs:
        try:
            rows = bench_spec(
                path, tuple(args.devices), args.repeat, not args.no_check_memory, args.follow
            )
        except (OSError, SpindleError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 1
        for n, row in rows:
            med = {
                k: statistics.median(getattr(t, k) for t in row.timings)
                for k in ("total_s", "compile_s", "plan_s", "draw_s")
            }
            worst = max(worst, med["total_s"])
            print(
                f"{path.stem:18} {n:4} {med['total_s']:7.3f} {med['compile_s']:8.3f} "
                f"{med['plan_s']:7.3f} {med['draw_s']:7.3f}  {row.outcome}{_followed(row)}"
            )
    print(f"slowest median re-plan: {worst:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
