"""Predicted against measured peak memory per rank, term by term, for the plans of a spec.

Plans ``SPEC`` for ``--nproc`` devices with each scheduler asked, trains each plan for a few
steps on that many gloo worker processes (``spindle train`` would do the same), and prints per
rank the plan's predicted peak (``plan.memory_bytes``) beside the peak the runtime measured
(``backends/torch/memory.py``: the tensor bytes the step holds, not process RSS), and both
split into terms: the prediction as the planner's memory model adds it up (``state``: weights
of every part the rank holds and its share of the optimizer state; the gradients alive at the
peak; the activations kept for backward summed over its slices; the loss phase's tensors; the
largest working set of one slice), the measurement as the meter found it at the moment of the
peak (parameters, gradients, optimizer state, activations, communication buffers).
``--micro-batches`` / ``--zero-stage`` plan with that lever and run it; ``--tp K`` plans every
entry on K or more devices K-way tensor parallel (``spindle plan --tp``). The target: predicted
within 20% of measured on every rank for cpu_medium with 2 ranks, default and sequential
plans.

    .venv/bin/python bench/memory_check.py [SPEC] [--nproc 2] [--steps 3] [--stages]
                                          [--scheduler default sequential]
                                          [--micro-batches K] [--zero-stage S] [--tp K]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from spindle_dsl.cost.base import CostModel, SliceMemory
from spindle_dsl.cost.step import spread_share
from spindle_dsl.cost.step_parts import sink_losses
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Entry, Plan
from spindle_dsl.planner.evaluate.build import slice_memory_of
from spindle_dsl.planner.evaluate.ledger import DeviceBreakdown, PartLedger
from spindle_dsl.planner.model.levers import Levers, micro_graph
from spindle_dsl.planner.model.problem import Piece

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = REPO.parent / "shared" / "spec" / "cpu_medium.spindle"
MiB = 2**20


# The planner's memory model applied to a plan it did not make: each entry's slice priced under
# the plan's own levers on one pass's view of the graph, added up on a ``PartLedger`` the way
# placement adds them while planning (a plan written or edited by hand has no trustworthy
# ``memory_bytes``).


def entry_slices(
    graph: MetaGraph, plan: Plan, cost: CostModel
) -> Iterator[tuple[Entry, SliceMemory]]:
    """Per entry of ``plan``, in wave order, its slice memory as the planner prices it: one
    pass's view of the graph under the plan's levers (``cost`` must price slice memory: the
    analytic and profiled models do). Entries of the same shape are priced once."""
    recompute = frozenset(m.id for m in plan.metaops if m.recompute)
    levers = Levers(plan.micro_batches, plan.zero_stage, recompute)
    view = micro_graph(graph, plan.micro_batches)
    memo: dict[tuple[str, int, int, int], SliceMemory] = {}
    for wave in plan.waves:
        for e in wave.entries:
            key = (e.metaop, len(e.devices), e.first, e.end)
            if key not in memo:
                op = view.op(e.metaop)
                memo[key] = slice_memory_of(cost, view, op, len(e.devices), e.first, e.end, levers)
            yield e, memo[key]


def plan_ledger(graph: MetaGraph, plan: Plan, cost: CostModel) -> PartLedger:
    """A ledger holding every entry of ``plan`` on its devices, and the loss tensors of the
    lm sinks it spreads on their loss devices (``Plan.loss_devices``)."""
    entries = list(entry_slices(graph, plan, cost))
    memo = {(e.metaop, len(e.devices), e.first, e.end): sm for e, sm in entries}
    recompute = frozenset(m.id for m in plan.metaops if m.recompute)
    levers = Levers(plan.micro_batches, plan.zero_stage, recompute)
    view = micro_graph(graph, plan.micro_batches)

    def slice_of(op: str, n: int, first: int, end: int) -> SliceMemory:
        key = (op, n, first, end)
        if key not in memo:  # a spread sink's last layer on its loss devices' count
            memo[key] = slice_memory_of(cost, view, view.op(op), n, first, end, levers)
        return memo[key]

    ledger = PartLedger(plan.cluster.devices, slice_of)
    last: dict[str, Entry] = {}
    for e, _ in entries:
        piece = Piece(e.metaop, e.first, e.end, len(e.devices))
        ledger.add(piece, list(e.devices), ledger.need(piece))
        last[e.metaop] = e
    sinks = {s.sink: s for s in sink_losses(graph)}
    for sink, devices in plan.loss_devices:
        share = spread_share(sinks[sink], graph.op(sink).batch, plan.micro_batches, len(devices))
        ledger.spread_loss(sink, last[sink].end, last[sink].devices, devices, share)
    return ledger


def predicted_peaks(graph: MetaGraph, plan: Plan, cost: CostModel) -> tuple[int, ...]:
    """Predicted peak bytes per device of ``plan`` (what the planner writes as
    ``memory_bytes`` for plans it makes)."""
    return plan_ledger(graph, plan, cost).memory()


def predicted_breakdowns(graph: MetaGraph, plan: Plan, cost: CostModel) -> list[DeviceBreakdown]:
    """Per device, the terms the peak adds up from (state, gradients, kept, loss, working)."""
    ledger = plan_ledger(graph, plan, cost)
    return [ledger.breakdown(d) for d in range(plan.cluster.devices)]


def predicted_terms(graph, plan, cost) -> list[dict[str, float]]:
    """Per device, the planner memory model's terms for ``plan``
    (``predicted_breakdowns``: weights and optimizer state of each held part, state
    shared by its holders; the gradients alive at the peak; kept activations summed; the loss
    phase's tensors; the largest working set)."""
    return [
        {
            "state": b.state,
            "gradients": b.gradients,
            "kept": sum(b.kept.values()),
            "loss": b.loss,
            "working": b.working,
        }
        for b in predicted_breakdowns(graph, plan, cost)
    ]


def _stage_table(graph, plan, cost, kept_by_stage) -> None:
    """Per plan entry: the activation bytes the model says one device keeps for the backward,
    beside what the entry's first device measured (its forward's saved tensors and output)."""
    print(f"  {'entry':<34}{'devices':>9}{'kept pred MiB':>15}{'measured':>10}{'pred/meas':>11}")
    for e, sm in entry_slices(graph, plan, cost):
        key = f"{e.metaop} [{e.first},{e.end})"
        got = kept_by_stage[e.devices[0]].get(key, 0)
        ratio = f"{sm.kept / got:>11.2f}" if got else f"{'-':>11}"
        print(f"  {key:<34}{len(e.devices):>9}{sm.kept / MiB:>15.1f}{got / MiB:>10.1f}{ratio}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="?", default=str(DEFAULT_SPEC))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--scheduler", nargs="+", default=["default", "sequential"])
    ap.add_argument("--micro-batches", type=int)
    ap.add_argument("--zero-stage", type=int, choices=(0, 1, 2))
    ap.add_argument("--tp", type=int, help="tensor-parallel degree forced on every entry")
    ap.add_argument(
        "--stages", action="store_true", help="also compare kept activations entry by entry"
    )
    args = ap.parse_args()

    from spindle_dsl.backends.base import RunConfig
    from spindle_dsl.backends.torch import TorchBackend
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.errors import SpindleError
    from spindle_dsl.language import compile_file
    from spindle_dsl.planner import make_plan

    try:
        graph = compile_file(args.spec, cluster_overrides={"devices": args.nproc}).graph
        cost = make_cost_model(graph.cluster, tp=args.tp)
        config = RunConfig(
            steps=args.steps,
            progress=False,
            micro_batches=args.micro_batches,
            zero_stage=args.zero_stage,
        )
        print(
            f"{Path(args.spec).name} on {args.nproc} gloo ranks, float32, peak over "
            f"{args.steps} steps (MiB); prediction from the analytic cost model's memory terms"
        )
        worst = 0.0
        for scheduler in args.scheduler:
            plan = make_plan(
                graph,
                cost,
                scheduler=scheduler,
                micro_batches=args.micro_batches,
                zero_stage=args.zero_stage,
            )
            result = TorchBackend().train(graph, plan, config, nproc=args.nproc)
            terms = predicted_terms(graph, plan, cost)
            extra = result.extra
            layouts = sorted({plan.layout_text(e) or "dp" for w in plan.waves for e in w.entries})
            print(
                f"\n{scheduler} ({plan.solver.name}, micro_batches {extra['micro_batches']}, "
                f"zero_stage {extra['zero_stage']}, layouts {' '.join(layouts)})"
            )
            head = f"{'rank':<6}{'predicted':>10}{'measured':>10}{'pred/meas':>10}   "
            print(head + "predicted terms | measured terms at the peak")
            for rank, measured in enumerate(extra["measured_peak_bytes"]):
                predicted = plan.memory_bytes[rank] if plan.memory_bytes else 0
                ratio = predicted / measured if measured else float("nan")
                worst = max(worst, abs(ratio - 1))
                p = " ".join(f"{k} {v / MiB:.1f}" for k, v in terms[rank].items())
                m = " ".join(f"{k} {v / MiB:.1f}" for k, v in extra["peak_terms"][rank].items())
                print(
                    f"{rank:<6}{predicted / MiB:>10.1f}{measured / MiB:>10.1f}{ratio:>10.2f}   "
                    f"{p} | {m}"
                )
            if args.stages:
                _stage_table(graph, plan, cost, extra["kept_by_stage"])
        print(f"\nlargest |predicted/measured - 1| over ranks and plans: {100 * worst:.0f}%")
    except SpindleError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
