"""The planner's memory model applied to a plan it did not make.

A plan written by hand, or one whose entries someone edited, has no trustworthy
``memory_bytes``; checking the memory model against what the runtime measures needs the
prediction for exactly the plan that ran. This prices each entry's slice under the plan's
own levers (micro-batches, ZeRO stage, recompute) on one pass's view of the graph and adds
the slices up on a ``PartLedger``, the way placement adds them while planning.
"""

from __future__ import annotations

from collections.abc import Iterator

from spindle_dsl.cost.base import CostModel, SliceMemory
from spindle_dsl.cost.step import spread_share
from spindle_dsl.cost.step_parts import sink_losses
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Entry, Plan
from spindle_dsl.planner.evaluate.build import slice_memory_of
from spindle_dsl.planner.evaluate.ledger import DeviceBreakdown, PartLedger
from spindle_dsl.planner.model.levers import Levers, micro_graph
from spindle_dsl.planner.model.problem import Piece


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
