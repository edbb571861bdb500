"""What memory a plan needs at the least, the message that says what does not fit, and the
allocations the lever search can offer each MetaOp within memory (``offered_specs``).

``MemoryFloor`` is a bound no placement can beat, read off the cost model once per graph:
every parameter part lives on at least one device with its whole optimizer state, and every
sample's kept activations live somewhere (data parallelism only splits them). When even the
floor exceeds the cluster's memory, no schedule can help, and the message says how many
devices it would take; otherwise it names the fullest device and what fills it.

The allocations the lever search can offer each MetaOp at k micro-batches, for the LP bound.

Why. With memory enforced, every plan the planner makes is scheduled in a context of its lever
search (``LeverSearch.context``: k, a ZeRO stage it tries at k, a recompute set), and a
context offers the schedulers each MetaOp's spec under those levers only
(``build.offered_spec``: the allocations on which one layer, and where any does the whole
MetaOp, fits alone on one device). That spec reads the levers only through k, the stage and
whether that MetaOp recomputes. So at k, in every plan, a MetaOp runs without recompute on the
allocations of its no-recompute spec at some stage, or recomputing on those of its recompute
spec at some stage: the union over the stages of each, at the least T(n) where several list
n (``lp_bound.merged``), covers both. An allocation on which one device cannot hold the MetaOp
without recompute is in the first only where no allocation holds the whole MetaOp (the
per-layer test alone), which the cluster-wide memory room (``lp_bound.MemoryRoom``) cannot
see: qwen_val at 16 devices must recompute or run wider for want of one device's memory.

Narrowing is a tightening, never needed for validity: a MetaOp's whole curve at ZeRO-1 (the
quickest stage: ZeRO-2 only adds gradient traffic, ``levers.reduction_share``, at the same
allocations) holds every spec offered. So where the search's first setting at k (ZeRO-1,
nothing recomputed) offers a MetaOp every allocation its curve lists, memory narrows nothing
there, and its whole curves without and with recompute stand in for the specs; elsewhere
each setting's ZeRO-1 spec comes first, and the other stages' only where it narrows too (it
saves most of the cost on large clusters, where each spec checks every allocation's bytes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from spindle_dsl.cost.base import CostModel
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.planner.bound.lp_bound import MemoryRoom, merged
from spindle_dsl.planner.evaluate.build import (
    Evaluated,
    LayerTooBig,
    PlanContext,
    gib,
    offered_spec,
)
from spindle_dsl.planner.model.levers import Levers, micro_graph, pass_curves, spec_of
from spindle_dsl.planner.model.problem import OpSpec

if TYPE_CHECKING:
    from spindle_dsl.metagraph import MetaOp
    from spindle_dsl.planner.search.leversearch import Fit, LeverSearch


ADVICE = (
    "use more devices (--devices) or larger ones (--device), a smaller global batch, "
    "or freeze some modules"
)


@dataclass(frozen=True)
class MemoryFloor:
    """Least device memory the whole graph needs, summed over devices."""

    states: int  # every part once: weights and the whole optimizer state
    kept: dict[str, int]  # activations each MetaOp keeps for backward and its loss tensors
    kept_recompute: dict[str, int]  # the same with activation recompute

    def by_op(self, recompute: Iterable[str]) -> dict[str, int]:
        rc = set(recompute)
        return {k: (self.kept_recompute[k] if k in rc else v) for k, v in self.kept.items()}

    def total(self, recompute: Iterable[str]) -> int:
        return self.states + sum(self.by_op(recompute).values())


def memory_floor(graph: MetaGraph, cost: CostModel) -> MemoryFloor:
    """The floor from a cost model with ``slice_memory`` (one device holds a whole MetaOp:
    no data-parallel rounding, no tensor-parallel split)."""
    parts: dict[str, int] = {}
    kept: dict[str, int] = {}
    kept_rc: dict[str, int] = {}
    for op in graph.metaops:
        plain = cost.slice_memory(graph, op, 1, 0, op.layers, False)  # type: ignore[attr-defined]
        rc = cost.slice_memory(graph, op, 1, 0, op.layers, True)  # type: ignore[attr-defined]
        for p in plain.parts:
            parts[p.key] = max(parts.get(p.key, 0), p.replicated + p.sharded)
        kept[op.id], kept_rc[op.id] = plain.kept + plain.loss, rc.kept + rc.loss
    return MemoryFloor(sum(parts.values()), kept, kept_rc)


def memory_room(search: LeverSearch, k: int) -> MemoryRoom:
    """What memory asks of every plan at k passes, for the LP bound (``lp_bound``, module
    docstring, "Memory"): the floor's kept bytes per MetaOp without and with recompute, the
    allocations the search's contexts can offer each MetaOp at k without and with recompute
    (``offered_specs``: where one device holds it), and the cluster's bytes less
    every part's state held once. Every plan that fits keeps them within it: its devices'
    peaks sum to at least the floor of its recompute set (``MemoryFloor``)."""
    floor = search.floor(k)
    freeing = frozenset(o for o, v in floor.kept.items() if floor.kept_recompute[o] < v)
    c = search.graph.cluster
    plain, recompute = offered_specs(search, k, freeing)
    return MemoryRoom(
        recompute,
        dict(floor.kept),
        dict(floor.kept_recompute),
        float(c.devices * c.device.memory_bytes - floor.states),
        plain,
    )


def _frugal_bytes(ctx: PlanContext, op_id: str) -> int:
    """Without per-part memory: min over n of n * memory(all the op's layers)."""
    op = ctx.graph.op(op_id)
    return min(n * ctx.cost.memory_bytes(op, n, op.layers) for n in ctx.problem.op(op_id).ns)


def _lever_words(ctx: PlanContext) -> str:
    """The levers the overflowing plan was made with ("" when it pulled none)."""
    lv = ctx.levers
    if lv.micro_batches == 1 and lv.zero_stage == 1 and not lv.recompute:
        return ""
    return f"even with {lv.describe(len(ctx.graph.metaops))}, "


def overflow_message(ctx: PlanContext, ev: Evaluated, limits: str = "") -> str:
    """Say what does not fit, by how much, and what to change; ``limits`` (from the lever
    search) says which levers are at their limit and how many devices it takes, in place of
    the levers the plan was made with."""
    cap = ctx.topology.capacity
    name = ctx.graph.cluster.device.name
    N = ctx.topology.devices
    if ctx.per_part:
        floor = memory_floor(ctx.pass_graph, ctx.cost)
        by_op = floor.by_op(ctx.recompute)
        total = floor.total(ctx.recompute)
        what = (
            f"activations kept for backward and loss tensors {gib(sum(by_op.values()))}, "
            f"parameters with optimizer state {gib(floor.states)}; "
        )
    else:
        by_op = {o.id: _frugal_bytes(ctx, o.id) for o in ctx.problem.ops}
        total = sum(by_op.values())
        what = "each on its most memory-frugal allocation; "
    words = "" if limits else _lever_words(ctx)
    if total > N * cap:
        top = sorted(by_op.items(), key=lambda kv: -kv[1])[:3]
        biggest = ", ".join(f"'{k}' {gib(v)}" for k, v in top)
        return (
            f"the MetaOps do not fit: they need at least {gib(total)} of device memory in all "
            f"({what}largest: {biggest}), but {N} x {name} hold {gib(N * cap)}; {words}"
            f"{ADVICE}{limits or f' (at least {-(-total // cap)} devices of this kind)'}"
        )
    mem = ev.placement.memory
    d = max(range(N), key=lambda i: mem[i])
    fullest = ev.placement.fullest
    kept = sorted((fullest.kept if fullest else {}).items(), key=lambda kv: -kv[1])
    if not kept:  # nothing kept for backward: name the MetaOps that run there
        kept = [(p.op, 0) for w in ev.placement.waves for p in w if d in p.devices]
    listed = ", ".join(f"'{k}' {gib(v)}" for k, v in kept[:3] if v) or "no activations"
    extra = ""
    if fullest and (fullest.state or fullest.working):
        extra = f"; parameters and optimizer state {gib(fullest.state)}"
        if fullest.gradients:
            extra += f", gradients alive at the peak {gib(fullest.gradients)}"
        if fullest.loss:
            extra += f", loss tensors {gib(fullest.loss)}"
        extra += f", working set {gib(fullest.working)}"
    top = kept[0][0] if kept else "?"
    label = "kept activations: " if ctx.per_part else ""
    whole = ""
    if ctx.per_part and sum(mem) > N * cap:
        whole = (
            f"; the whole plan needs {gib(sum(mem))}, more than the {N} devices hold "
            f"({gib(N * cap)}), as every device of a MetaOp's group keeps a copy of its "
            f"weights"
        )
    return (
        f"MetaOp '{top}' does not fit: device {d} would hold {gib(mem[d])} "
        f"({label}{listed}{extra}), but a {name} has {gib(cap)}{whole}; {words}{ADVICE}"
        f"{limits}"
    )


def least_devices(search: LeverSearch) -> int:
    """Devices of this kind the MetaOps need at the least with every lever at its limit (the
    most micro-batches tried, recompute wherever it shrinks them): the floor over capacity."""
    k = max(search.ks)
    floor = memory_floor(micro_graph(search.graph, k), search.cost)
    cap = search.graph.cluster.device.memory_bytes
    return -(-floor.total(floor.kept) // cap)


def no_fit_message(search: LeverSearch, fit: Fit) -> str:
    """Why no setting of the levers fits: the closest plan's overflow (or the layer that fits
    nowhere), the levers at their limit, and the least devices it would take."""
    k = max(search.ks)
    forced = len(search.ks) == 1
    stages = " and ".join(f"ZeRO-{z}" for z in search.stages)
    limits = (
        f"; every memory lever is at its limit: {k} micro-batches"
        f"{' (as asked)' if forced else ' (there micro-batches stop shrinking)'}, {stages}, "
        f"activation recompute wherever it helps, and it would take at least "
        f"{least_devices(search)} devices of this kind"
    )
    last = fit.last
    if last is not None and last.ctx is not None:
        ev = last.least_over()
        if ev is not None:
            return overflow_message(last.ctx, ev, limits)
    if last is not None and last.error is not None:
        return f"{last.error}; {ADVICE}{limits}"
    return f"no plan fits in device memory; {ADVICE}{limits}"


Specs = dict[str, OpSpec]


def offered_specs(search: LeverSearch, k: int, freeing: frozenset[str]) -> tuple[Specs, Specs]:
    """Per MetaOp, what the search's contexts at k can offer it without recompute and, for
    the MetaOps of ``freeing``, with it (``offered``). A MetaOp one of whose layers fits
    nowhere so is absent from that mapping."""
    plain: Specs = {}
    rc: Specs = {}
    for op in search.pricing.view(k).metaops:
        spec, narrowed = offered(search, op, Levers(k))
        if spec is not None:
            plain[op.id] = spec
        if op.id not in freeing:
            continue
        quick = Levers(k, 1, freeing)
        spec = offered(search, op, quick)[0] if narrowed else whole_curve(search, op, quick)
        if spec is not None:
            rc[op.id] = spec
    return plain, rc


def whole_curve(search: LeverSearch, op: MetaOp, levers: Levers) -> OpSpec:
    """``op``'s whole pass curve under ``levers``, every allocation up to the devices."""
    N = search.graph.cluster.devices
    curve = pass_curves(search.graph, search.cost, levers, search.pricing)[op.id]
    return spec_of(op, [(n, t) for n, t in curve.items() if n <= N])


def offered(search: LeverSearch, op: MetaOp, quick: Levers) -> tuple[OpSpec | None, bool]:
    """What the contexts at ``quick``'s k and recompute set (``op`` recomputing or not)
    offer ``op`` under the search's ZeRO stages, and whether memory narrows it: its specs
    merged, or its whole ZeRO-1 curve where ZeRO-1 offers all of it (module docstring);
    None where none offers any allocation."""
    whole = whole_curve(search, op, quick)
    specs = []
    # ZeRO-1 first; the stages the search tries at this k (``LeverSearch.stages_at``)
    for z in sorted(search.stages_at(quick.micro_batches), key=lambda z: z != 1):
        levers = replace(quick, zero_stage=z)
        curves = pass_curves(search.graph, search.cost, levers, search.pricing)
        try:
            spec = offered_spec(op, search.cost, curves, levers, True, search.pricing)
        except LayerTooBig:
            continue
        if z == 1 and spec.ns == whole.ns:
            return whole, False
        specs.append(spec)
    return (merged(specs) if specs else None), True
