"""Match the devices at wave boundaries: rename devices on one side of a cut so that the pieces
just after it run where their inputs are.

Why. Placement goes wave by wave (``planner.evaluate.placement``): a piece claims its preferred
devices (its own previous devices, else its producers') among what the wave's other pieces
left, and no later wave can change what an earlier one chose. Where several pieces of a wave
want the same devices, or a MetaOp resumes after a wave away from its devices, the loser
lands elsewhere and its rows cross the boundary, often between nodes, as activation moves that
a step model prices as waiting (``cost.step``; ``bench/specs/ofasys_7task`` at 16 devices has
such moves).

What. Renaming devices by one permutation in every wave from a cut on (or in every wave
before it) keeps every wave a valid wave and changes only what crosses the cut (module
docstring of ``planner.evaluate.relabel``, the search that prices these renamings beside the loss
phase's). For a cut, the renaming here (``matching_label``) takes the pieces of the first
wave after it, the one moving the most bytes first (``Topology.weight``), and names its
devices after its source's (its MetaOp's previous piece, else the last piece of the producer
moving the most bytes), pair by pair in their shard order; with ``prefix`` it names the
source's devices after the piece's instead. Every other device keeps its id where that is
free, else takes a free id in its own node first. Only the cuts whose wave shows moves the
compute does not hide, at least ``MIN_SHOWN`` of the step, are proposed
(``cuts_with_moves``).
"""

from __future__ import annotations

from collections.abc import Mapping

from spindle_dsl.planner.evaluate.build import Evaluated, PlanContext
from spindle_dsl.planner.evaluate.lossbalance import Waves
from spindle_dsl.planner.evaluate.nodepool import NodePool
from spindle_dsl.planner.evaluate.placement import PlacedPiece

MIN_SHOWN = 0.0005  # skip a boundary whose moves show less than this share of the step


def source_piece(
    ctx: PlanContext, last: Mapping[str, PlacedPiece], p: PlacedPiece
) -> PlacedPiece | None:
    """Where ``p`` reads its rows from, ``last`` being each MetaOp's latest piece before
    ``p``'s wave: its MetaOp's previous piece, else the last piece of its producer moving the
    most bytes; None for a piece with neither (a MetaOp that starts from the raw batch)."""
    if p.op in last:
        return last[p.op]
    deps = [d for d in ctx.problem.op(p.op).deps if d in last]
    if not deps:
        return None
    return last[max(deps, key=lambda d: ctx.topology.weight.get(d, 0.0))]


def matching_label(ctx: PlanContext, waves: Waves, cut: int, prefix: bool) -> list[int] | None:
    """The renaming ``label`` (device ``x`` becomes ``label[x]``) of the waves from ``cut`` on
    (``prefix``: of those before it) that puts the pieces of wave ``cut`` on their sources'
    devices (module docstring); None where it would rename nothing."""
    devices, per_node = ctx.topology.devices, ctx.topology.per_node
    label = [-1] * devices
    taken = [False] * devices
    weight = ctx.topology.weight
    last: dict[str, PlacedPiece] = {}
    for wave in waves[:cut]:
        for q in wave:
            last[q.op] = q
    for p in sorted(waves[cut], key=lambda p: -weight.get(p.op, 0.0)):
        src = source_piece(ctx, last, p)
        if src is None:
            continue
        # pair by pair in shard order; a group larger than the other keeps its extra devices
        pairs = (src.devices, p.devices) if prefix else (p.devices, src.devices)
        for x, y in zip(*pairs, strict=False):
            if label[x] < 0 and not taken[y]:
                label[x], taken[y] = y, True
    if all(y < 0 or y == x for x, y in enumerate(label)):
        return None
    rest = [x for x in range(devices) if label[x] < 0]
    for x in rest:  # keep its id where nobody took it
        if not taken[x]:
            label[x], taken[x] = x, True
    free = NodePool((y for y in range(devices) if not taken[y]), per_node)
    for x in rest:
        if label[x] < 0:  # a free id in its own node first
            label[x] = free.take(x // per_node)
    return label


def cuts_with_moves(ev: Evaluated, micro_batches: int) -> list[int]:
    """The boundaries worth renaming at: those whose wave shows moves worth at least
    ``MIN_SHOWN`` of the step (``Timing.wave_transfer``, one pass's; the most first), or,
    without a step model's split, every boundary."""
    shown = ev.timing.wave_transfer
    n = len(ev.placement.waves)
    if not shown:
        return list(range(1, n))
    least = MIN_SHOWN * ev.iteration_s / max(1, micro_batches)
    return sorted((c for c in range(1, n) if shown[c] >= least), key=lambda c: -shown[c])
