"""The facts about a plan that several pictures draw: where each entry sits in time, which
activations cross device groups, and where devices sit idle.

The wave picture, the timeline and the Chrome trace must agree on these (the same flows drawn
as arrows in one and as flow events in another), so they are computed once, here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

from spindle_dsl.errors import PlanFormatError
from spindle_dsl.plan.model import Entry, Plan, PlanMetaOp
from spindle_dsl.render.colors import Palette, palette, task_order


@dataclass(frozen=True)
class Placed:
    """One plan entry with the context a picture needs: its wave, start time and MetaOp."""

    wave: int
    start_s: float  # entries start when their wave starts
    entry: Entry
    op: PlanMetaOp

    @property
    def end_s(self) -> float:
        return self.start_s + self.entry.time_s

    @property
    def label(self) -> str:
        """``image_chat/vision [0,24)``: the MetaOp and its layer range."""
        return f"{self.op.id} [{self.entry.first},{self.entry.end})"


@dataclass(frozen=True)
class ActivationFlow:
    """Activations moving from ``src`` to ``dst`` on a different set of devices.

    ``dep``: the last entry of a MetaOp feeds the first entry of a MetaOp that consumes it;
    ``layers``: a MetaOp split across waves hands its hidden state to its next layer range."""

    src: Placed
    dst: Placed
    kind: Literal["dep", "layers"]


@dataclass(frozen=True)
class Idle:
    """``device`` does nothing from ``start_s`` for ``duration_s`` inside wave ``wave``."""

    wave: int
    device: int
    start_s: float
    duration_s: float


def plan_palette(plan: Plan) -> Palette:
    """Task colours for a plan: the MetaOps' task order, the same order its MetaGraph gives."""
    return palette(task_order(m.task for m in plan.metaops))


def placed_entries(plan: Plan) -> tuple[Placed, ...]:
    """Every entry in wave order; raises PlanFormatError for an entry naming no MetaOp."""
    ops = {m.id: m for m in plan.metaops}
    out = []
    for wave in sorted(plan.waves, key=lambda w: w.index):
        for e in wave.entries:
            if e.metaop not in ops:
                raise PlanFormatError(
                    f"wave {wave.index} has an entry for '{e.metaop}', which the plan's "
                    "metaops do not list"
                )
            out.append(Placed(wave.index, wave.start_s, e, ops[e.metaop]))
    return tuple(out)


def activation_flows(plan: Plan, placed: tuple[Placed, ...] | None = None) -> list[ActivationFlow]:
    """Flows whose two ends run on different device sets (same-device hand-offs stay local)."""
    placed = placed_entries(plan) if placed is None else placed
    by_op: dict[str, list[Placed]] = {}
    for p in placed:
        by_op.setdefault(p.op.id, []).append(p)
    flows: list[ActivationFlow] = []
    for op in plan.metaops:
        mine = by_op.get(op.id, [])
        for a, b in itertools.pairwise(mine):
            if set(a.entry.devices) != set(b.entry.devices):
                flows.append(ActivationFlow(a, b, "layers"))
        if not mine:
            continue
        for dep in op.deps:
            theirs = by_op.get(dep)
            if theirs and set(theirs[-1].entry.devices) != set(mine[0].entry.devices):
                flows.append(ActivationFlow(theirs[-1], mine[0], "dep"))
    return flows


def idle_spans(plan: Plan, placed: tuple[Placed, ...] | None = None) -> list[Idle]:
    """Per device and wave, the time the device waits: the wave's length minus its entry's."""
    placed = placed_entries(plan) if placed is None else placed
    busy: dict[tuple[int, int], float] = {}
    for p in placed:
        for d in p.entry.devices:
            busy[(p.wave, d)] = busy.get((p.wave, d), 0.0) + p.entry.time_s
    out = []
    for w in sorted(plan.waves, key=lambda w: w.index):
        for d in range(plan.cluster.devices):
            used = busy.get((w.index, d), 0.0)
            gap = w.duration_s - used
            if gap > 1e-9 * max(w.duration_s, 1e-12):
                out.append(Idle(w.index, d, w.start_s + used, gap))
    return out


@dataclass(frozen=True)
class Overhead:
    """Predicted time the waves do not hold (activation transfers, gradient sync): the plan
    counts it in ``iteration_s`` after the last wave, so pictures draw it there."""

    start_s: float
    duration_s: float
    label: str


def overhead(plan: Plan) -> Overhead | None:
    """The tail between the last wave's end and ``iteration_s``, named from the breakdown."""
    end = max((w.start_s + w.duration_s for w in plan.waves), default=0.0)
    tail = plan.iteration_s - end
    if tail <= 1e-9 * max(plan.iteration_s, 1e-12):
        return None
    parts = [
        name.removesuffix("_s").replace("_", " ")
        for name, secs in plan.breakdown
        if name != "compute_s" and secs > 0
    ]
    return Overhead(end, tail, " + ".join(parts) if parts else "outside the waves")
