"""The allocations the lever search can offer each MetaOp at k micro-batches, for the LP bound.

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

from dataclasses import replace
from typing import TYPE_CHECKING

from spindle_dsl.planner.bound.lp_bound import merged
from spindle_dsl.planner.evaluate.build import LayerTooBig, offered_spec
from spindle_dsl.planner.model.levers import Levers, pass_curves, spec_of
from spindle_dsl.planner.model.problem import OpSpec

if TYPE_CHECKING:
    from spindle_dsl.metagraph import MetaOp
    from spindle_dsl.planner.search.leversearch import LeverSearch

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
