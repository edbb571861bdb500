"""What a schedule of mixes costs: planning every phase, and switching plans inside a run.

Table 1, planning (no training): for tiny_schedule (3 phases, 4 CPU devices) and a
qwen_val-sized job with a schedule (examples/qwen_val.spindle with ``schedule { 0: pretrain;
2000: audio_heavy }`` appended, 32 A800s), the seconds to plan every phase one after the other
in this process (``--jobs 0``), side by side (this process and a worker process per other
plan) and by default (workers only for idle cores), the median of ``--repeat`` runs; beside
them, what one phase's curves and planning context cost, the part that sharing between phases
could save.

Table 2, switching (tiny_schedule trained for 8 steps on 4 gloo workers, float32): each switch's
seconds on rank 0 and on the slowest rank, the bytes the ranks sent, and the median step time of
the phase the run switches from and of the one it switches to.

    .venv/bin/python bench/schedule_bench.py [--repeat K] [--skip-train] [--time-limit S]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QWEN_SCHEDULE = "\nschedule {\n  0: pretrain\n  2000: audio_heavy\n}\n"


def workloads():
    from spindle_dsl.language import compile_file, compile_text

    tiny = compile_file(REPO / "examples" / "tiny_schedule.spindle")
    qwen_text = (REPO / "examples" / "qwen_val.spindle").read_text() + QWEN_SCHEDULE
    qwen = compile_text(qwen_text, "qwen_val+schedule", cluster_overrides={"devices": 32})
    return [
        ("tiny_schedule, 4 x cpu", tiny.schedule),
        ("qwen_val+schedule, 32 x A800", qwen.schedule),
    ]


def time_planning(schedule, jobs: int | None, repeat: int, limit: float | None) -> float:
    from spindle_dsl.planner.search.phases import plan_schedule

    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan_schedule(schedule, jobs=jobs, time_limit_s=limit)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_shareable(schedule) -> float:
    """Seconds to price one phase's curves and build its planning context (the first's)."""
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.planner.evaluate.build import context

    graph = schedule.phases[0].graph
    t0 = time.perf_counter()
    context(graph, make_cost_model(graph.cluster))
    return time.perf_counter() - t0


def planning_table(repeat: int, limit: float | None) -> None:
    from spindle_dsl.planner.search.helpers import spare_cores
    from spindle_dsl.planner.search.phases import distinct_graphs

    load = os.getloadavg()[0]
    print(f"Table 1: planning every phase (median of {repeat} runs; load average {load:.1f} "
          f"on {os.cpu_count()} cores, {spare_cores()} spare)")  # fmt: skip
    head = f"{'workload':<30} {'phases':>6} {'plans':>5} {'serial s':>9} {'side by side s':>14} "
    print(head + f"{'speed-up':>8} {'default s':>9} {'curves+context s':>16}")
    for name, schedule in workloads():
        plans = len(distinct_graphs(schedule)[0])
        serial = time_planning(schedule, 0, repeat, limit)
        side = time_planning(schedule, plans - 1, repeat, limit)
        auto = time_planning(schedule, None, repeat, limit)
        print(
            f"{name:<30} {len(schedule):>6} {plans:>5} {serial:>9.2f} {side:>14.2f} "
            f"{serial / side:>7.2f}x {auto:>9.2f} {time_shareable(schedule):>16.4f}"
        )
    print("(side by side: a helper process per plan but the first; default: helpers only for")
    print(" spare cores, so serial on a busy machine)")


def switch_table(repeat: int) -> None:
    from spindle_dsl.backends.base import RunConfig
    from spindle_dsl.backends.torch import TorchBackend
    from spindle_dsl.planner.search.phases import plan_schedule

    name, schedule = workloads()[0]
    bundle = plan_schedule(schedule)
    print(f"\nTable 2: switching plans inside a run ({name}, 8 steps, 4 gloo workers, float32)")
    print(
        f"{'run':>3} {'before step':>11} {'to mix':<14} {'rank 0 s':>9} {'slowest s':>9} "
        f"{'sent MiB':>8} {'step before s':>13} {'step after s':>12} {'switch/step':>11}"
    )
    for run in range(1, repeat + 1):
        config = RunConfig(steps=8, progress=False)
        result = TorchBackend().train(
            schedule.phases[0].graph, bundle, config, nproc=4, schedule=schedule
        )
        steps = {r.step: r.seconds for r in result.steps}
        bounds = [p.first_step for p in schedule.phases] + [8]
        for s in result.extra["switches"]:
            k = next(i for i, b in enumerate(bounds) if b == s["step"])
            before = statistics.median(steps[j + 1] for j in range(bounds[k - 1], bounds[k]))
            after = statistics.median(steps[j + 1] for j in range(bounds[k], bounds[k + 1]))
            slowest = max(v["seconds"] for v in s["per_rank"])
            sent = sum(v["sent_bytes"] for v in s["per_rank"]) / 2**20
            print(
                f"{run:>3} {s['step'] + 1:>11} {s['mix']:<14} {s['seconds']:>9.3f} "
                f"{slowest:>9.3f} {sent:>8.1f} {before:>13.3f} {after:>12.3f} "
                f"{slowest / min(before, after):>10.2f}x"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (default 3)")
    parser.add_argument("--skip-train", action="store_true", help="planning only")
    parser.add_argument("--time-limit", type=float, help="MILP time limit per phase (s)")
    args = parser.parse_args()
    planning_table(args.repeat, args.time_limit)
    if not args.skip_train:
        switch_table(max(1, args.repeat - 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
