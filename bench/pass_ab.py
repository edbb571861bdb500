"""What one planner pass buys on every plan-quality row: the default plan with all passes
against the same plan with that pass off, interleaved (on, off, then off, on, ...).

    .venv/bin/python bench/pass_ab.py global_milp [--repeat 2] [--time-limit S] [--tables 1,3,4,7]

Rows: Table 1 (memory-blind), Table 3's paper workloads and Table 4 (memory enforced) and
Table 7 (CPU workers over 2 shared cores) of ``bench/plan_quality.py``, planned as there.
Each row prints every run's iteration time, the change of the medians (positive: the plan is
slower without the pass) and the mean planning time of each side. ``--tables ablation``
there switches passes off on fewer rows; this is the check a pass must pass before it is
removed (under 1% on every row).
"""

from __future__ import annotations

import argparse
import statistics

from plan_quality import CONFIGS, CORES_ROWS, GAP_ROWS, SHARED_CORES, _graph, timed_plan

from spindle_dsl.planner import DEFAULT_TIME_LIMIT_S
from spindle_dsl.planner.model.levers import ALL_PASSES, PassOptions

# table, spec, mix, devices, cores (None: one per worker), memory enforced
Row = tuple[str, str, str | None, int, int | None, bool]


def rows() -> list[Row]:
    """Every row of Tables 1, 3 (the paper workloads, those Table 4 lacks), 4 and 7, with
    how that table plans it."""
    return [
        *(("1", name, mix, n, None, False) for name, mix, n in CONFIGS),
        *(
            ("3", name, mix, n, None, True)
            for name, mix, n in CONFIGS
            if (name, mix, n) not in GAP_ROWS
        ),
        *(("4", name, mix, n, None, True) for name, mix, n in GAP_ROWS),
        *(("7", name, None, n, SHARED_CORES, True) for name, n in CORES_ROWS),
    ]


def plan_once(row: Row, passes: PassOptions, time_limit: float) -> tuple[float, float]:
    """The default plan's iteration time (nan: none fits) and the planning time."""
    _, name, mix, n, cores, enforced = row
    graph = _graph(name, mix, n, cores=cores)
    plan, wall, _ = timed_plan(graph, time_limit, passes=passes, check_memory=enforced)
    return (plan.iteration_s if plan is not None else float("nan")), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=PassOptions.names(), help="the pass to switch off")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S)
    parser.add_argument("--tables", default="1,3,4,7", help="the tables whose rows to plan")
    args = parser.parse_args()
    sides = {"on": ALL_PASSES, "off": ALL_PASSES.without(args.name)}
    print(f"without {args.name}: iteration ms per run, change of the medians, planning s")
    tables = set(args.tables.split(","))
    for row in (r for r in rows() if r[0] in tables):
        runs: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
        for r in range(args.repeat):
            for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
                runs[side].append(plan_once(row, sides[side], args.time_limit))
        its = {s: [it * 1e3 for it, _ in runs[s]] for s in runs}
        change = statistics.median(its["off"]) / statistics.median(its["on"]) - 1
        wall = {s: statistics.mean(w for _, w in runs[s]) for s in runs}
        table, name, mix, n, _, _ = row
        label = f"T{table} {name}{'/' + mix if mix else ''} {n}"
        print(
            f"{label:<32} on {' '.join(f'{x:.1f}' for x in its['on'])}"
            f"  off {' '.join(f'{x:.1f}' for x in its['off'])}  {change:+.2%}"
            f"  planning {wall['on']:.2f} / {wall['off']:.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
