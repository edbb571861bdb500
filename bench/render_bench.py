"""How long drawing a plan takes, per fixture: the target is under 2 s for every picture.

Plans each fixture with the default scheduler (timed apart, it is not rendering), then times
every renderer on the plan: the two DOT graphs (source, then ``dot -Tsvg``), the matplotlib
timeline, the Chrome trace and the whole HTML report (which draws every picture again). Prints
a table and exits 1 if any single rendering takes longer than the target.

    .venv/bin/python bench/render_bench.py [SPEC ...] [--devices N] [--repeat K]
        [--no-memory-check]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 2.0


def best_of(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def time_renderers(graph, plan, repeat: int) -> dict[str, float]:
    """Best-of-``repeat`` seconds for each picture (DOT ones drawn to SVG when dot exists) and
    for the whole report, which draws them all again."""
    from spindle_dsl.render.dot_metagraph import metagraph_dot
    from spindle_dsl.render.dot_waves import waves_dot
    from spindle_dsl.render.graphviz_tools import dot_available, render_dot
    from spindle_dsl.render.report import build_report
    from spindle_dsl.render.timeline import timeline_bytes
    from spindle_dsl.render.trace import plan_trace

    def svg_or_source(g):
        return render_dot(g, "svg") if dot_available() else g.source

    return {
        "mg_dot": best_of(lambda: svg_or_source(metagraph_dot(graph)), repeat),
        "wv_dot": best_of(lambda: svg_or_source(waves_dot(plan)), repeat),
        "timeline": best_of(lambda: timeline_bytes(plan, "svg"), repeat),
        "trace": best_of(lambda: plan_trace(plan), repeat),
        "report": best_of(lambda: build_report(plan, graph), repeat),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", type=Path)
    parser.add_argument("--devices", type=int, help="override the spec's device count")
    parser.add_argument("--repeat", type=int, default=3, help="best of K runs (default 3)")
    parser.add_argument(
        "--no-memory-check",
        action="store_true",
        help="plan even when the plan overflows device memory (qwen_val does at 64 devices)",
    )
    args = parser.parse_args()
    specs = args.specs or sorted((REPO / ".." / "shared" / "spec").glob("*.spindle"))
    if not specs:
        print("no specs given and ../shared/spec is absent", file=sys.stderr)
        return 2

    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.errors import SpindleError
    from spindle_dsl.language import compile_file
    from spindle_dsl.planner import make_plan
    from spindle_dsl.render.graphviz_tools import dot_available

    t0 = time.perf_counter()
    import matplotlib.figure  # noqa: F401  (import cost reported once, not per fixture)

    print(f"matplotlib import: {time.perf_counter() - t0:.3f} s; dot installed: {dot_available()}")
    cols = ("spec", "devices", "waves", "entries", "plan_s", "mg_dot", "wv_dot", "timeline",
            "trace", "report", "slowest")  # fmt: skip
    print(" ".join(f"{c:>10}" for c in cols))
    worst = 0.0
    for spec in specs:
        overrides = {"devices": args.devices} if args.devices else None
        graph = compile_file(str(spec), cluster_overrides=overrides).graph
        t0 = time.perf_counter()
        try:
            plan = make_plan(
                graph, make_cost_model(graph.cluster), check_memory=not args.no_memory_check
            )
        except SpindleError as exc:
            print(f"{spec.stem:>10} cannot be planned: {exc.render().splitlines()[0]}")
            continue
        plan_s = time.perf_counter() - t0

        times = time_renderers(graph, plan, args.repeat)
        slowest = max(times.values())
        worst = max(worst, slowest)
        entries = sum(len(w.entries) for w in plan.waves)
        row = [spec.stem, plan.cluster.devices, len(plan.waves), entries, f"{plan_s:.2f}"]
        row += [f"{times[k]:.3f}" for k in ("mg_dot", "wv_dot", "timeline", "trace", "report")]
        row.append(f"{slowest:.3f}")
        print(" ".join(f"{c!s:>10}" for c in row))
    verdict = "within" if worst < TARGET_S else "OVER"
    print(f"slowest single rendering: {worst:.3f} s ({verdict} the {TARGET_S} s target)")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
