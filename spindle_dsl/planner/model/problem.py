"""The planner's own view of a MetaGraph: MetaOps reduced to layers, deps and a time curve,
and the continuous optimum of a MetaLevel (``level_optimum``) every scheduler aims at.

Every scheduler works on a ``Problem`` rather than on the MetaGraph, for two reasons: the
algorithms only need L_m, deps and T_m(n) (Spindle's MetaOp abstraction), and tests can build
problems directly, including random ones, without going through the language. Schedules are
device-free (``Piece`` says *how many* devices, not which); placement turns them into entries.

Spindle's resource allocation for one MetaLevel (paper section on MetaLevel allocation).

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

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise

from spindle_dsl.errors import PlanError

EPS = 1e-9


@dataclass(frozen=True)
class OpSpec:
    """One MetaOp as the schedulers see it: ``layers`` identical layers, T(n) per layer."""

    id: str
    layers: int
    deps: tuple[str, ...]
    ns: tuple[int, ...]  # allocations the planner may use, increasing
    seconds: tuple[float, ...]  # T(n) per layer for each of ``ns``
    task: str = ""
    switch_s: float = 0.0  # estimated cost of moving its activations to other devices mid-op
    # the share of T(n) its backward takes (``cost.analytic.backward_share``): a pass runs
    # every wave's forward, then the backwards, so a wave lasts its slowest forward plus its
    # slowest backward (``wave_seconds``); 2/3 trains weights, 0 runs forward only
    backward_share: float = 2 / 3

    def __post_init__(self) -> None:
        assert self.layers >= 1, f"{self.id}: a MetaOp has at least one layer"
        assert len(self.ns) == len(self.seconds) > 0, f"{self.id}: empty curve"

    @cached_property
    def _t(self) -> dict[int, float]:
        return dict(zip(self.ns, self.seconds, strict=True))

    def t(self, n: int) -> float:
        """Seconds per layer on ``n`` devices (KeyError for an allocation not in ``ns``)."""
        return self._t[n]

    def valid(self, n: int) -> bool:
        return n in self._t

    @cached_property
    def pareto(self) -> tuple[int, ...]:
        """Allocations that are strictly faster than every smaller one.

        Giving an op more devices only to run slower is never useful, so the continuous
        optimum and the paper's scheduler only ever pick from these (Spindle assumes T_m(n)
        non-increasing; a measured curve may not be).
        """
        out: list[int] = []
        best = float("inf")
        for n, s in zip(self.ns, self.seconds, strict=True):
            if s < best * (1 - 1e-12):
                out.append(n)
                best = s
        return tuple(out)

    @cached_property
    def pareto_seconds(self) -> tuple[float, ...]:
        """T(n) at each pareto point: strictly decreasing."""
        return tuple(self.t(n) for n in self.pareto)

    @cached_property
    def pareto_negated(self) -> tuple[float, ...]:
        """``-pareto_seconds``, increasing: what ``bisect`` searches for a time."""
        return tuple(-t for t in self.pareto_seconds)

    @cached_property
    def min_area(self) -> float:
        """Least device-seconds one layer can cost: min over n of n * T(n)."""
        return min(n * s for n, s in zip(self.ns, self.seconds, strict=True))

    @cached_property
    def min_time(self) -> float:
        """Least seconds one layer can take, on any allocation."""
        return min(self.seconds)

    def largest_at_most(self, limit: int) -> int:
        """The largest valid allocation not above ``limit`` (the smallest one if none is)."""
        i = bisect_right(self.ns, limit)
        return self.ns[i - 1] if i else self.ns[0]

    def fastest_within(self, limit: int) -> int:
        """The quickest allocation of at most ``limit`` devices (the least pareto point if
        none is): the largest pareto point not above it, each being quicker than every
        smaller allocation."""
        i = bisect_right(self.pareto, limit)
        return self.pareto[i - 1] if i else self.pareto[0]

    def least_within(self, seconds: float, layers: int | None = None) -> int | None:
        """The least pareto allocation on which ``layers`` layers (default: all) end within
        ``seconds``, if any (pareto points get quicker as they grow: a bisection)."""
        pts = self.pareto
        k = self.layers if layers is None else layers
        if k * self.t(pts[-1]) > seconds:
            return None
        lo, hi = 0, len(pts) - 1  # pts[hi] ends within it
        while lo < hi:
            mid = (lo + hi) // 2
            if k * self.t(pts[mid]) <= seconds:
                hi = mid
            else:
                lo = mid + 1
        return pts[lo]

    def next_faster(self, n: int, limit: int) -> int | None:
        """The smallest pareto allocation above ``n`` and at most ``limit``, if any.

        Every pareto point above ``n`` is faster than ``n`` (it beats every smaller
        allocation), so this is a bisection, not a scan."""
        i = bisect_right(self.pareto, n)
        if i < len(self.pareto) and self.pareto[i] <= limit:
            return self.pareto[i]
        return None


def wave_phases(
    pieces: Iterable[tuple[OpSpec, float, int]], lanes: int | None = None
) -> tuple[float, float, float]:
    """The forward, the backward and the slowest piece whole of a wave whose pieces are (op,
    seconds of the piece's layers, devices), each piece split by its op's backward share.

    A phase lasts its slowest piece's share; where the devices share fewer cores (``lanes``:
    ``Problem.lanes``), at least the phase's device-seconds over the cores too, since the
    step model runs a node's devices at most ``cores`` at a time. The step model's makespan
    (``cost.step.shared_makespan``) is never below this floor, which a scheduler can weigh
    linearly (the wave MILP's and the re-split's ``area``)."""
    forward = backward = whole = 0.0
    work_forward = work_backward = 0.0  # device-seconds, summed only on shared cores
    for op, seconds, n in pieces:
        back = seconds * op.backward_share
        forward, backward = max(forward, seconds - back), max(backward, back)
        whole = max(whole, seconds)
        if lanes is not None:
            work_forward += n * (seconds - back)
            work_backward += n * back
    if lanes is not None:
        forward = max(forward, work_forward / lanes)
        backward = max(backward, work_backward / lanes)
    return forward, backward, whole


def wave_seconds(pieces: Iterable[tuple[OpSpec, float, int]], lanes: int | None = None) -> float:
    """How long a wave lasts whose pieces are (op, seconds of the piece's layers, devices): a
    pass runs every wave's forward, then every backward, so the slowest forward plus the
    slowest backward, which is the slowest piece whole where all split their time alike (and
    never less, whatever rounding says); on shared cores, each phase at least its work over
    ``lanes`` (``wave_phases``)."""
    forward, backward, whole = wave_phases(pieces, lanes)
    return max(forward + backward, whole)


@dataclass(frozen=True)
class Problem:
    """MetaOps in a topological order plus the number of devices to share among them."""

    ops: tuple[OpSpec, ...]
    devices: int
    # where the devices share fewer cores (CPU workers), the cores that advance their work at
    # once (``cost.step.StepModel.lanes``): a wave lasts at least its device-seconds over them
    # (``wave_phases``), so a scheduler that fills every device gains nothing; None: every
    # device runs on a core of its own
    lanes: int | None = None

    def __post_init__(self) -> None:
        if self.lanes is not None and not 1 <= self.lanes < self.devices:
            raise PlanError(f"lanes must be 1 to {self.devices - 1} or None, got {self.lanes}")
        seen: set[str] = set()
        for op in self.ops:
            for d in op.deps:
                if d not in seen:
                    raise PlanError(f"MetaOp '{op.id}' depends on '{d}', which is not before it")
            seen.add(op.id)

    def __iter__(self) -> Iterator[OpSpec]:
        return iter(self.ops)

    @cached_property
    def _by_id(self) -> dict[str, OpSpec]:
        return {o.id: o for o in self.ops}

    def op(self, op_id: str) -> OpSpec:
        return self._by_id[op_id]

    @cached_property
    def level(self) -> dict[str, int]:
        """MetaLevel of each op: the length of the longest dep chain ending at it."""
        out: dict[str, int] = {}
        for op in self.ops:
            out[op.id] = 1 + max((out[d] for d in op.deps), default=-1)
        return out

    @cached_property
    def height(self) -> dict[str, int]:
        """Length of the longest chain of consumers after each op (0 for a sink)."""
        out: dict[str, int] = {o.id: 0 for o in self.ops}
        for op in reversed(self.ops):
            for d in op.deps:
                out[d] = max(out[d], out[op.id] + 1)
        return out

    @cached_property
    def levels(self) -> tuple[tuple[str, ...], ...]:
        depth = max(self.level.values(), default=-1) + 1
        return tuple(tuple(o.id for o in self.ops if self.level[o.id] == lv) for lv in range(depth))


@dataclass(frozen=True)
class Piece:
    """Layers ``[first, end)`` of one op on ``n`` devices (which devices comes later)."""

    op: str
    first: int
    end: int
    n: int

    @property
    def layers(self) -> int:
        return self.end - self.first


@dataclass(frozen=True)
class Schedule:
    """Waves of pieces, device-free. ``status``/``gap`` describe how it was found."""

    name: str
    waves: tuple[tuple[Piece, ...], ...]
    status: str = "heuristic"
    gap: float | None = None
    notes: tuple[str, ...] = field(default=())

    def durations(self, problem: Problem) -> tuple[float, ...]:
        return tuple(piece_wave_seconds(problem, w) for w in self.waves)

    def compute_s(self, problem: Problem) -> float:
        return sum(self.durations(problem))

    def switches_s(self, problem: Problem) -> float:
        """Estimated transfers: each change of allocation inside an op moves its activations."""
        last: dict[str, int] = {}
        total = 0.0
        for w in self.waves:
            for p in w:
                if p.op in last and last[p.op] != p.n:
                    total += problem.op(p.op).switch_s
                last[p.op] = p.n
        return total

    def score(self, problem: Problem) -> float:
        """What the schedulers minimise: compute plus estimated mid-op transfers."""
        return self.compute_s(problem) + self.switches_s(problem)


def piece_wave_seconds(problem: Problem, wave: Iterable[Piece]) -> float:
    """``wave_seconds`` of a wave of ``problem``'s pieces."""
    pieces = []
    for p in wave:
        op = problem.op(p.op)
        pieces.append((op, p.layers * op.t(p.n), p.n))
    return wave_seconds(pieces, problem.lanes)


def schedule_errors(problem: Problem, sched: Schedule) -> list[str]:
    """Why ``sched`` is not a valid wave schedule for ``problem`` (empty when it is).

    The same invariants as the plan format, minus devices: coverage in layer order, deps in
    strictly earlier waves, allocations valid and within the device count.
    """
    errs: list[str] = []
    done_at: dict[str, int] = {}
    next_layer: dict[str, int] = {o.id: 0 for o in problem.ops}
    for wi, wave in enumerate(sched.waves):
        used = 0
        in_wave: set[str] = set()
        for p in wave:
            if p.op not in next_layer:
                errs.append(f"wave {wi}: unknown op {p.op}")
                continue
            op = problem.op(p.op)
            if p.op in in_wave:
                errs.append(f"wave {wi}: {p.op} appears twice")
            in_wave.add(p.op)
            if not op.valid(p.n):
                errs.append(f"wave {wi}: {p.op} on {p.n} devices is not a valid allocation")
            used += p.n
            if p.first != next_layer[p.op] or p.end <= p.first:
                errs.append(f"wave {wi}: {p.op} layers [{p.first},{p.end}) out of order")
            next_layer[p.op] = max(next_layer[p.op], p.end)
            for d in op.deps:
                if d not in done_at or done_at[d] >= wi:
                    errs.append(f"wave {wi}: {p.op} runs before its dep {d} has finished")
        if used > problem.devices:
            errs.append(f"wave {wi}: uses {used} devices of {problem.devices}")
        for p in wave:
            if p.op in next_layer and next_layer[p.op] == problem.op(p.op).layers:
                done_at.setdefault(p.op, wi)
    for op in problem.ops:
        if next_layer[op.id] != op.layers:
            errs.append(f"{op.id}: covers {next_layer[op.id]} of {op.layers} layers")
    return errs


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
