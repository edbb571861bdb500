"""The predicted speed-up of the default plan over every baseline on the bundled paper-scale
workloads, planned as ``spindle plan`` plans them (memory enforced, each baseline at its own
best memory levers from the same search or at the plan's, whichever is quicker).

    .venv/bin/python bench/speedups.py [--devices 8,16,32,64] [--markdown]

Each row: the workload (spec and mix), the device count, the default plan's predicted
iteration, its speed-up over the sequential plan (Megatron-LM / DeepSpeed style), distmm,
optimus and the paper's wavefront schedule, and its iteration over the proven lower bound.
The figures are the cost model's predictions for the spec's cluster (A800 GPUs), not
measurements.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_file
from spindle_dsl.planner import make_plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WORKLOADS = (("multitask_clip", None), ("qwen_val", "pretrain"), ("qwen_val", "audio_heavy"))
BASELINES = ("sequential", "distmm", "optimus", "paper")


@dataclass(frozen=True)
class Row:
    """One planned workload: its predicted iteration and the speed-ups over the baselines."""

    workload: str
    devices: int
    iteration_s: float
    speedups: dict[str, float]
    over_bound: float
    plan_s: float


def plan_row(spec: str, mix: str | None, devices: int) -> Row:
    graph = compile_file(
        EXAMPLES / f"{spec}.spindle", mix=mix, cluster_overrides={"devices": devices}
    ).graph
    t0 = time.perf_counter()
    plan = make_plan(graph, make_cost_model(graph.cluster))
    took = time.perf_counter() - t0
    others = {k.removesuffix("_s"): v for k, v in plan.baselines}
    # the paper's wavefront schedule is a candidate of the default scheduler, tuned alike
    others.setdefault("paper", plan.extra.get("candidates_s", {}).get("paper", float("nan")))
    return Row(
        workload=spec if mix is None else f"{spec}/{mix}",
        devices=devices,
        iteration_s=plan.iteration_s,
        speedups={name: others[name] / plan.iteration_s for name in BASELINES},
        over_bound=plan.iteration_s / plan.lower_bound_s,
        plan_s=took,
    )


def render(rows: list[Row], markdown: bool) -> str:
    head = ["workload", "devices", "iteration", *(f"x {b}" for b in BASELINES), "/ bound"]
    body = [
        [
            r.workload,
            str(r.devices),
            f"{r.iteration_s * 1e3:.1f} ms",
            *(f"{r.speedups[b]:.2f}x" for b in BASELINES),
            f"{r.over_bound:.2f}",
        ]
        for r in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in body])
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) for cells in [head, *body]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="8,16,32,64", help="comma-separated device counts")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    counts = [int(n) for n in args.devices.split(",")]
    rows = [
        plan_row(spec, mix, n)
        for spec, mix in WORKLOADS
        for n in counts
        if not (spec == "qwen_val" and n < 16)  # a 7B LM with its towers needs 16 A800s
    ]
    print(render(rows, args.markdown))
    print(f"planned in {sum(r.plan_s for r in rows):.1f} s ({len(rows)} plans)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
