"""Which MetaOps recompute their activations: the planner's memory fit loop.

Real training systems fit large models by recomputing activations in the backward pass (full
per-layer checkpointing) instead of keeping them. It costs one extra forward per layer, so it
is turned on only where memory demands it, in this order:

1. plan without recompute;
2. if even the cluster-wide floor (``memfit.MemoryFloor``) exceeds the cluster's memory, turn
   it on for MetaOps by decreasing *efficiency* (bytes of kept activations freed per second
   of extra forward compute) until the floor fits;
3. place a quick set of schedules; while the fastest of them overflows a device, turn it on
   for the most efficient MetaOps that run on an overflowing device, as many as the excess
   needs, and plan again;
4. stop when the fastest plan fits or recompute cannot help any more (every MetaOp with a
   backward pass recomputes, or the full devices hold none that could), and keep the round
   whose fastest fitting plan is quickest; if none fits, the PlanError says what does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from spindle_dsl.cost.base import CostModel
from spindle_dsl.errors import PlanError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.planner.build import Evaluated, PlanContext, context
from spindle_dsl.planner.memfit import MemoryFloor, gib, memory_floor


@dataclass(frozen=True)
class Candidate:
    """A MetaOp that could recompute, with what it would free and cost."""

    op: str
    freed: int  # bytes of kept activations the whole batch would no longer keep
    extra_s: float  # device-seconds of its extra forward passes (all layers)

    @property
    def efficiency(self) -> float:
        return self.freed / self.extra_s


def candidates(graph: MetaGraph, cost: CostModel, floor: MemoryFloor) -> tuple[Candidate, ...]:
    """MetaOps with a backward pass that recompute would shrink, most efficient first.

    Extra compute is read off the cost model's own curves (recompute vs not, at the smallest
    allocation, as device-seconds), so a profiled model ranks by measured times.
    """
    every = frozenset(op.id for op in graph.metaops)
    base = cost.curves(graph)
    slow = cost.curves(graph, recompute=every)  # type: ignore[call-arg]
    out = []
    for op in graph.metaops:
        freed = floor.kept[op.id] - floor.kept_recompute[op.id]
        if not op.needs_backward or freed <= 0:
            continue
        a, b = base[op.id], slow[op.id]
        n = a.ns[0]
        extra = op.layers * n * (b.at(n) - a.at(n))
        out.append(Candidate(op.id, freed, max(extra, 1e-12)))
    return tuple(sorted(out, key=lambda c: (-c.efficiency, c.op)))


def select_more(ctx: PlanContext, ev: Evaluated, cands: tuple[Candidate, ...]) -> tuple[str, ...]:
    """The most efficient MetaOps, not yet recomputing, whose recompute would relieve the
    devices ``ev`` overflows, until their estimated savings cover every excess."""
    cap = ctx.topology.capacity
    excess = {d: m - cap for d, m in enumerate(ev.placement.memory) if m > cap}
    pieces: dict[str, list] = {}
    for wave in ev.placement.waves:
        for p in wave:
            pieces.setdefault(p.op, []).append(p)
    chosen: list[str] = []
    for c in cands:
        if c.op in ctx.recompute or not any(
            excess.get(d, 0) > 0 for p in pieces.get(c.op, ()) for d in p.devices
        ):
            continue
        op = ctx.graph.op(c.op)
        saving: dict[int, float] = {}
        for p in pieces[c.op]:
            plain = ctx.slice_memory(p.op, p.n, p.first, p.end)
            rc = ctx.cost.slice_memory(ctx.graph, op, p.n, p.first, p.end, True)  # type: ignore[attr-defined]
            s = plain.kept + plain.working - rc.kept - rc.working
            for d in p.devices:
                saving[d] = saving.get(d, 0.0) + s
        if not any(v > 0 and excess.get(d, 0) > 0 for d, v in saving.items()):
            continue
        chosen.append(c.op)
        for d, v in saving.items():
            if d in excess:
                excess[d] -= v
        if all(v <= 0 for v in excess.values()):
            break
    return tuple(chosen)


@dataclass(frozen=True)
class FitState:
    """Where the fit loop stands: the context to plan with and why it recomputes.

    ``cands`` is None until recompute is first considered: pricing every MetaOp's recompute
    curve is skipped when the plan fits without it.
    """

    ctx: PlanContext
    floor: MemoryFloor
    cands: tuple[Candidate, ...] | None = None
    reasons: tuple[str, ...] = ()

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        if self.cands is None:
            return candidates(self.ctx.graph, self.ctx.cost, self.floor)
        return self.cands

    def step(self, ev: Evaluated) -> FitState | None:
        """One more round of step 3 after ``ev`` overflowed, or None if recompute cannot
        help further."""
        cands = self.candidates
        more = select_more(self.ctx, ev, cands)
        if not more:
            return None
        try:
            nxt = context(self.ctx.graph, self.ctx.cost, self.ctx.recompute | set(more))
        except PlanError:  # a recomputing layer no longer fits any allocation
            return None
        mem = ev.placement.memory
        d = max(range(len(mem)), key=mem.__getitem__)
        why = f"device {d} would hold {gib(mem[d])} of {gib(self.ctx.topology.capacity)}"
        return FitState(nxt, self.floor, cands, (*self.reasons, why))

    def note(self) -> str | None:
        """The plan note naming the recomputing MetaOps and why (None if none recompute)."""
        rc = self.ctx.recompute
        if not rc:
            return None
        cands = self.candidates
        names = ", ".join(f"'{c.op}'" for c in cands if c.op in rc)
        extra = sum(c.extra_s for c in cands if c.op in rc)
        total = len(self.ctx.graph.metaops)
        return (
            f"activation recompute on {len(rc)} of {total} MetaOps ({names}): without it "
            f"{'; then '.join(self.reasons)}; chosen by kept-activation bytes freed per second "
            f"of extra forward compute, largest first (about {extra:.3g} device-seconds more "
            f"compute per iteration)"
        )


def start(graph: MetaGraph, cost: CostModel) -> FitState:
    """Steps 1 and 2: no recompute, unless the cluster-wide floor demands some."""
    floor = memory_floor(graph, cost)
    c = graph.cluster
    limit = c.devices * c.device.memory_bytes
    if floor.total(()) <= limit:
        return FitState(context(graph, cost), floor)
    cands = candidates(graph, cost, floor)
    chosen: list[str] = []
    for cand in cands:
        if floor.total(chosen) <= limit:
            break
        chosen.append(cand.op)
    why = (
        f"the MetaOps need at least {gib(floor.total(()))} in all, but {c.devices} x "
        f"{c.device.name} hold {gib(limit)}"
    )
    return FitState(context(graph, cost, frozenset(chosen)), floor, cands, (why,))


def fit(
    graph: MetaGraph, cost: CostModel, quick: Callable[[PlanContext], list[Evaluated]]
) -> FitState:
    """Steps 1 to 4 with ``quick`` (a cheap set of schedules, placed) as the judge.

    Each round targets the fastest quick plan's overflow, so recompute is spent where it
    lets the best schedule fit rather than stopping at the first (often sequential) plan
    that happens to fit; of all rounds, the one whose fastest fitting plan is quickest wins.
    """
    state = start(graph, cost)
    best: tuple[float, FitState] | None = None
    while True:
        evs = quick(state.ctx)
        fitting = [e.iteration_s for e in evs if e.fits]
        if fitting and (best is None or min(fitting) < best[0]):
            best = (min(fitting), state)
        fastest = min(evs, key=lambda e: e.iteration_s)
        if fastest.fits:
            break
        nxt = state.step(fastest)
        if nxt is None and best is None:  # the fastest cannot be helped: any plan that fits
            cap = state.ctx.topology.capacity
            nxt = state.step(min(evs, key=lambda e: e.key(cap)))
        if nxt is None:
            break
        state = nxt
    return best[1] if best else state
