"""The paper's scheduler (`--scheduler paper`): allocation per MetaLevel, then greedy waves.

MetaLevels run one after another, as in Spindle. For each level: the continuous optimum and
the bi-point discretisation (``allocator``) give every MetaOp one or two (n, layers) tuples;
the wavefront scheduler then repeats four steps until the level's tuples are done:

1. propose: take MetaOps in decreasing order of remaining time and put one of each one's
   remaining tuples into the wave, the one with the most devices that still fits (a MetaOp's
   two tuples may run in either order: each only has to run once);
2. extend: while devices stay idle, give the MetaOp in the wave with the most remaining time
   its next faster valid allocation that fits;
3. align: the wave lasts as long as its shortest span (the least remaining time of a current
   tuple at its wave allocation); every other MetaOp is cut at layer granularity to the
   number of layers closest to that span (at least one);
4. commit: the layers run are taken off the tuples, and the next wave starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from spindle_dsl.planner.allocator import bipoint, level_optimum
from spindle_dsl.planner.problem import OpSpec, Piece, Problem, Schedule


@dataclass
class _Tuples:
    """Mutable bookkeeping of one MetaOp's remaining (n, layers) tuples within the level."""

    op: OpSpec
    tuples: list[list[int]]  # [n, remaining layers]
    next_layer: int = 0
    current: int = 0  # index of the tuple proposed for the wave being built

    def remaining_s(self) -> float:
        return sum(k * self.op.t(n) for n, k in self.tuples)

    @property
    def done(self) -> bool:
        return not self.tuples


def propose(states: list[_Tuples], devices: int) -> dict[str, int]:
    """Step 1: fill the devices with tuples, longest remaining time first."""
    free = devices
    chosen: dict[str, int] = {}
    for s in sorted(states, key=lambda s: -s.remaining_s()):
        fits = [i for i, (n, _) in enumerate(s.tuples) if n <= free]
        if fits:
            s.current = max(fits, key=lambda i: s.tuples[i][0])
            chosen[s.op.id] = s.tuples[s.current][0]
            free -= chosen[s.op.id]
    return chosen


def extend(states: dict[str, _Tuples], chosen: dict[str, int], devices: int) -> dict[str, int]:
    """Step 2: hand idle devices to the MetaOps in the wave with the most remaining time."""
    free = devices - sum(chosen.values())
    order = sorted(chosen, key=lambda i: -states[i].remaining_s())
    # an op that cannot get faster within the idle devices never can later (they only
    # shrink), so the scan resumes at the first op not yet exhausted
    first = 0
    while free > 0 and first < len(order):
        op_id = order[first]
        n = chosen[op_id]
        m = states[op_id].op.next_faster(n, n + free)
        if m is None:
            first += 1
            continue
        chosen[op_id] = m
        free -= m - n
    return chosen


def align(states: dict[str, _Tuples], chosen: dict[str, int]) -> tuple[Piece, ...]:
    """Step 3: cut every MetaOp to the wave's shortest span, at layer granularity."""
    spans = {
        i: states[i].tuples[states[i].current][1] * states[i].op.t(n) for i, n in chosen.items()
    }
    span = min(spans.values())
    pieces = []
    for op_id, n in chosen.items():
        s = states[op_id]
        left = s.tuples[s.current][1]
        k = left if spans[op_id] <= span else min(left, max(1, round(span / s.op.t(n))))
        pieces.append(Piece(op_id, s.next_layer, s.next_layer + k, n))
    return tuple(pieces)


def commit(states: dict[str, _Tuples], pieces: tuple[Piece, ...]) -> None:
    """Step 4: take the layers run off each MetaOp's proposed tuple."""
    for p in pieces:
        s = states[p.op]
        s.tuples[s.current][1] -= p.layers
        s.next_layer = p.end
        if s.tuples[s.current][1] == 0:
            s.tuples.pop(s.current)


def schedule_level(ops: list[OpSpec], devices: int) -> list[tuple[Piece, ...]]:
    """Allocate one MetaLevel (continuous optimum + bi-point) and cut it into waves."""
    opt = level_optimum(ops, devices)
    states = {o.id: _Tuples(o, [list(t) for t in bipoint(o, opt.n(o.id))]) for o in ops}
    waves: list[tuple[Piece, ...]] = []
    while True:
        live = [s for s in states.values() if not s.done]
        if not live:
            return waves
        chosen = extend(states, propose(live, devices), devices)
        pieces = align(states, chosen)
        commit(states, pieces)
        waves.append(pieces)


def paper_schedule(problem: Problem) -> Schedule:
    """Spindle's plan: each MetaLevel allocated and wave-scheduled in turn."""
    waves: list[tuple[Piece, ...]] = []
    for level in problem.levels:
        waves.extend(schedule_level([problem.op(i) for i in level], problem.devices))
    return Schedule("paper", tuple(waves), status="heuristic")
