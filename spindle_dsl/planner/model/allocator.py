"""Spindle's resource allocation for one MetaLevel (paper section on MetaLevel allocation).

Step 1, the continuous optimum: the MetaOps of a level are independent, so the level is a
malleable scheduling problem. With T_m^-1 interpolated between valid allocations, the optimum
finishes every MetaOp at the same time C, where sum_m T_m^-1(C / L_m) = N; the left-hand side
falls as C grows, so C is found by bisection.

Step 2, bi-point discretisation: the continuous n*_m usually lies between two valid
allocations n_lo < n*_m < n_hi. The paper replaces it by two integer tuples, (n_hi, l_hi) and
(n_lo, l_lo) with l_hi + l_lo = L_m and the layer split taken from n*'s position between the
two points, rounded to whole layers; by the linear interpolation the two parts take C between
them, as the continuous MetaOp did.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from itertools import pairwise

from spindle_dsl.planner.model.problem import EPS, OpSpec


@dataclass(frozen=True)
class LevelOptimum:
    """The continuous optimum of one MetaLevel: completion time C and n*_m per MetaOp."""

    completion_s: float
    n_star: tuple[tuple[str, float], ...]  # (op id, continuous devices), in level order
    idle: float  # devices the level cannot use even at C (every op at its fastest)

    def n(self, op_id: str) -> float:
        return dict(self.n_star)[op_id]


def inverse_time(op: OpSpec, per_layer_s: float) -> float:
    """T_m^-1: the continuous device count at which one layer takes ``per_layer_s``.

    Between two pareto points the inverse is linear in time (the paper's interpolation).
    Below the smallest valid allocation the op time-shares a device at constant area, so the
    relaxation stays a relaxation. Faster than the op can ever go: infinite demand.
    """
    pts, ts = op.pareto, op.pareto_seconds
    if per_layer_s >= ts[0]:
        return pts[0] * ts[0] / per_layer_s
    # the first pareto point at least this quick (times strictly fall along them); the
    # bisection's demand asks this for every op at every step, many levels a plan, so no
    # linear walk
    i = bisect_left(op.pareto_negated, -per_layer_s)
    if i < len(pts):
        lo, hi, t_lo, t_hi = pts[i - 1], pts[i], ts[i - 1], ts[i]
        return lo + (hi - lo) * (t_lo - per_layer_s) / (t_lo - t_hi)
    if per_layer_s >= ts[-1] * (1 - EPS):
        return float(pts[-1])
    return float("inf")


def level_optimum(ops: list[OpSpec] | tuple[OpSpec, ...], devices: int) -> LevelOptimum:
    """Bisection on C so that sum_m T_m^-1(C / L_m) = N (paper: continuous allocation)."""
    if not ops:
        return LevelOptimum(0.0, (), float(devices))
    floor = max(o.layers * o.t(o.pareto[-1]) for o in ops)  # no op can finish sooner

    def demand(c: float) -> float:
        return sum(inverse_time(o, c / o.layers) for o in ops)

    if demand(floor) <= devices:
        c = floor
    else:
        lo, hi = floor, sum(o.layers * o.min_area for o in ops) + floor
        while demand(hi) > devices:  # cannot happen with positive areas; guards rounding
            hi *= 2
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if demand(mid) > devices:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-12 * hi:
                break
        c = hi
    stars = tuple((o.id, inverse_time(o, c / o.layers)) for o in ops)
    return LevelOptimum(c, stars, max(0.0, devices - sum(n for _, n in stars)))


def bipoint(op: OpSpec, n_star: float) -> tuple[tuple[int, int], ...]:
    """Paper: bi-point discretisation of n*_m into (n, layers) tuples, larger n first."""
    pts = op.pareto
    if n_star <= pts[0] * (1 + EPS):
        return ((pts[0], op.layers),)
    for p in pts:
        if abs(p - n_star) <= EPS * p:
            return ((p, op.layers),)
    for lo, hi in pairwise(pts):
        if lo < n_star < hi:
            theta = (n_star - lo) / (hi - lo)
            l_hi = round(theta * op.layers)
            l_lo = op.layers - l_hi
            return tuple((n, k) for n, k in ((hi, l_hi), (lo, l_lo)) if k > 0)
    return ((pts[-1], op.layers),)
