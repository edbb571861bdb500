"""A level-by-level start for the ``milp`` scheduler that runs short MetaOps one after another
on shared devices, where the level's continuous optimum gives them less than one device.

The continuous optimum of a MetaLevel gives every MetaOp n* devices so that all end together
at C*. Many-task jobs have MetaOps with n* well under 1: a small text or IMU encoder that one
device runs in a third of C* (bench/specs/clip10 at 64 devices: half of its encoders are
given well under one device). An integer layout that gives each its own device
(``baselines.balanced``) leaves that device idle for the rest of the level, and the level
MILP, at the size of such a level, does not find better in seconds. The
LP bound's solution (``lp_bound``) runs them from the start beside the large encoders, on
one device each, for about half the level: this layout gives that shape whole devices by
running two or three of them in turn on one.

The layout, per level: for a completion time C, every op that one device runs within C is
packed first-fit decreasing into *lanes*, one device each, holding ops in turn up to C; every
other op gets the least valid allocation that ends within C. The least C whose lanes and
allocations fit in the devices is found by bisection; devices left over go to the op that
ends last, one faster allocation at a time (``minmax.give_to_slowest``). Levels run one after
another; spans are cut into waves at every boundary (``listsched.waveify``): a large op
spans several waves at one allocation, its layers cut where the lanes' ops change, so it
moves nothing. As every start, the scheduler then improves it (layer re-splits,
rebalanced waves) and polishes it.
"""

from __future__ import annotations

from fractions import Fraction

from spindle_dsl.planner.model.problem import OpSpec, Problem, Schedule
from spindle_dsl.planner.starts.listsched import Span, waveify
from spindle_dsl.planner.starts.minmax import give_to_slowest, least_fitting


def _lanes(ops: list[OpSpec], seconds: float) -> list[list[OpSpec]]:
    """First-fit decreasing: ops that one device runs within ``seconds``, in turn per lane."""
    lanes: list[list[OpSpec]] = []
    loads: list[float] = []
    for o in sorted(ops, key=lambda o: -o.layers * o.t(1)):
        need = o.layers * o.t(1)
        for i, load in enumerate(loads):
            if load + need <= seconds:
                lanes[i].append(o)
                loads[i] += need
                break
        else:
            lanes.append([o])
            loads.append(need)
    return lanes


def _layout(ops: list[OpSpec], seconds: float) -> tuple[dict[str, int], list[list[OpSpec]]] | None:
    """Allocations of the ops that need more than a device, and the lanes of the rest, all
    within ``seconds``; None if some op cannot end within it."""
    alone: dict[str, int] = {}
    shared: list[OpSpec] = []
    for o in ops:
        n = o.least_within(seconds)
        if n is None:
            return None
        if n == 1 and o.valid(1):
            shared.append(o)
        else:
            alone[o.id] = n
    return alone, _lanes(shared, seconds)


def _devices(layout: tuple[dict[str, int], list[list[OpSpec]]]) -> int:
    alone, lanes = layout
    return sum(alone.values()) + len(lanes)


def pack_level(ops: list[OpSpec], devices: int) -> list[Span] | None:
    """The level's spans from time 0 (module docstring); None if even one op per device in
    turn does not fit (``devices`` below some op's least allocation plus one lane)."""
    hi = sum(o.layers * o.t(o.pareto[0]) for o in ops)  # everything in turn
    first = _layout(ops, hi)
    if first is None or _devices(first) > devices:
        return None

    def fit(seconds: float) -> tuple[dict[str, int], list[list[OpSpec]]] | None:
        got = _layout(ops, seconds)
        return got if got is not None and _devices(got) <= devices else None

    lo = max(o.layers * o.t(o.pareto[-1]) for o in ops)  # no op ends sooner than this
    best = least_fitting(lo, hi, fit, first, tolerance=1e-6)
    alone, lanes = best
    by_id = {o.id: o for o in ops}
    give_to_slowest(alone, [by_id[i] for i in alone], devices - _devices(best))
    spans = [Span.after(by_id[i], n, Fraction(0)) for i, n in alone.items()]
    for lane in lanes:
        at = Fraction(0)
        for o in lane:
            spans.append(Span.after(o, 1, at))
            at = spans[-1].end
    return spans


def packed_schedule(problem: Problem) -> Schedule | None:
    """MetaLevels in turn, each packed (``pack_level``); None where some level does not pack
    (the caller keeps its other starts)."""
    waves = []
    for level in problem.levels:
        spans = pack_level([problem.op(i) for i in level], problem.devices)
        if spans is None:
            return None
        waves.extend(waveify(spans))
    return Schedule("packed", tuple(waves))
