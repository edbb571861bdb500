"""The allocations the lever search can offer each MetaOp at k micro-batches, for the LP bound.

Why. With memory enforced, every plan the planner makes is scheduled in a context of its lever
search (``LeverSearch.context``: k, a ZeRO stage of ``search.stages``, a recompute set), and a
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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spindle_dsl.planner.build import LayerTooBig, offered_spec
from spindle_dsl.planner.levers import Levers, pass_curves
from spindle_dsl.planner.lp_bound import merged
from spindle_dsl.planner.problem import OpSpec

if TYPE_CHECKING:
    from spindle_dsl.planner.leversearch import LeverSearch


def offered_specs(search: LeverSearch, k: int, recompute: frozenset[str]) -> dict[str, OpSpec]:
    """Per MetaOp, what the search's contexts at k can offer it without recompute (with an
    empty ``recompute``) or, for the MetaOps of ``recompute``, recomputing: its specs under
    every ZeRO stage the search tries, merged. A MetaOp one of whose layers fits nowhere so
    is absent (no plan runs it that way)."""
    micro = search.pricing.view(k)
    out: dict[str, OpSpec] = {}
    for z in search.stages:
        levers = Levers(k, z, recompute)
        curves = pass_curves(search.graph, search.cost, levers, search.pricing)
        for op in micro.metaops:
            if recompute and op.id not in recompute:
                continue
            try:
                spec = offered_spec(op, search.cost, curves, levers, True, search.pricing)
            except LayerTooBig:
                continue
            out[op.id] = merged([out[op.id], spec]) if op.id in out else spec
    return out
