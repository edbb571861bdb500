"""A MILP over waves (python-mip; HiGHS or CBC, see ``solver``): which MetaOps run in which
wave, on how many devices, for how many layers, so that the sum of wave durations is least.

Model (``W`` waves, candidate allocations ``n in C_m`` per MetaOp):

* ``y[m,w,n]`` integer: layers of m run in wave w on n devices; ``x[m,w,n]`` binary: m uses n
  devices in wave w; ``d[w] >= 0`` continuous: wave w's duration.
* ``cover[m]``: sum y = L_m.  ``link``: y <= L_m x and y >= x (no entry without layers).
* ``one[m,w]``: at most one allocation of m per wave.  ``cap[w]``: sum n x <= N.
* ``dur[m,w]``: d[w] >= sum_n T_m(n) y[m,w,n]. Where the MetaOps split their time between
  forward and backward differently (a frozen tower runs forward only; ``wave_seconds``), a
  wave lasts its slowest forward plus its slowest backward: ``fwd[w]`` and ``bwd[w]`` bound
  each phase of every piece (its T_m(n) y times 1 - s_m, times s_m) and d[w] >= fwd + bwd.
* ``area[w]`` where the devices share fewer cores (``lanes``, CPU workers): each phase (d[w]
  where the ops split alike) at least the wave's device-seconds over the cores,
  sum n T_m(n) y[m,w,n] / lanes (``problem.wave_phases``), so that the solver does not fill
  devices that have no core to run on.
* ``prec[p,m,w]`` (cross-level): L_p * active(m,w) <= layers of p done in waves before w, so a
  MetaOp may start in the first wave after its own inputs are done, whatever its level.
* objective: sum d[w] plus a price per entry: the op's estimated cost of moving its
  activations to other devices (``OpSpec.switch_s``), since every extra entry may do so.

The ``milp`` scheduler solves it once per round as ``global_milp``, over a few allocations
per MetaOp and warm-started from the best improved start, so it can only match or beat it
(the one pass that finds plans the starts' heuristics miss on qwen_val audio_heavy at 32 and
64 devices); ``bench/wave_optimum.py`` solves it over every allocation for a minute, to see
how far the heuristics stop from the best waves.

Waves a MetaOp cannot use (before its depth, or too late to leave room for its consumers) get
no variables. Building is separate from solving; solving returns a ``MilpResult`` holding plain
values (status mapped to ``SolveStatus``), never solver objects, so that ``solve_waves`` can
run the whole build-and-solve in the isolated worker process and return its result.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import mip

from spindle_dsl.planner.improve.resplit import add_area
from spindle_dsl.planner.model.problem import (
    OpSpec,
    Piece,
    Problem,
    Schedule,
    level_optimum,
    wave_phases,
    wave_seconds,
)
from spindle_dsl.planner.solver import isolate
from spindle_dsl.planner.solver.choice import SolverChoice, collector_paused, new_model

ENTRY_PRICE = 1e-5  # objective units (fractions of the scale) charged per entry


class SolveStatus(str, enum.Enum):
    """What the solver could say about its answer, in the project's words."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # a solution, not proven optimal within the time limit
    NO_SOLUTION = "no_solution"  # time ran out before any solution
    INFEASIBLE = "infeasible"
    ERROR = "error"


_STATUS = {
    mip.OptimizationStatus.OPTIMAL: SolveStatus.OPTIMAL,
    mip.OptimizationStatus.FEASIBLE: SolveStatus.FEASIBLE,
    mip.OptimizationStatus.NO_SOLUTION_FOUND: SolveStatus.NO_SOLUTION,
    mip.OptimizationStatus.INFEASIBLE: SolveStatus.INFEASIBLE,
    mip.OptimizationStatus.INT_INFEASIBLE: SolveStatus.INFEASIBLE,
}


@dataclass(frozen=True)
class WaveModelSpec:
    """Everything the model is built from; the ops' dependencies among themselves are kept
    (``prec``). ``start`` (a warm start) must fit ``waves``."""

    ops: tuple[OpSpec, ...]  # in a topological order
    devices: int
    waves: int
    candidates: tuple[tuple[int, ...], ...]  # allocations per op, same order as ops
    start: tuple[tuple[Piece, ...], ...] | None = None
    lanes: int | None = None  # the cores the devices share, where fewer (``Problem.lanes``)


@dataclass(frozen=True)
class MilpResult:
    status: SolveStatus
    objective_s: float | None  # sum of wave durations of the solution, seconds
    bound_s: float | None  # the solver's lower bound on its objective (with entry prices), s
    gap: float | None  # the solver's relative gap on its objective
    wall_s: float
    waves: tuple[tuple[Piece, ...], ...]  # the solution, empty waves dropped
    variables: int
    constraints: int


@dataclass
class _Built:
    model: mip.Model
    spec: WaveModelSpec
    scale: float
    x: dict[tuple[int, int, int], Any]
    y: dict[tuple[int, int, int], Any]
    d: list[Any]
    phases: tuple[list[Any], list[Any]] | None = None  # per wave: forward, backward


def windows(spec: WaveModelSpec) -> list[tuple[int, int]]:
    """First and last wave each op may use: depth from the sources, height to the sinks."""
    index = {o.id: i for i, o in enumerate(spec.ops)}
    depth = [0] * len(spec.ops)
    height = [0] * len(spec.ops)
    for i, o in enumerate(spec.ops):
        depth[i] = 1 + max((depth[index[d]] for d in o.deps if d in index), default=-1)
    for i in reversed(range(len(spec.ops))):
        for d in spec.ops[i].deps:
            if d in index:
                height[index[d]] = max(height[index[d]], height[i] + 1)
    return [(depth[i], spec.waves - 1 - height[i]) for i in range(len(spec.ops))]


def _scale(spec: WaveModelSpec) -> float:
    """Seconds per objective unit, so that the solver's tolerances see numbers near 1."""
    if spec.start:
        ops = {o.id: o for o in spec.ops}
        total = sum(
            wave_seconds(((ops[p.op], p.layers * ops[p.op].t(p.n), p.n) for p in w), spec.lanes)
            for w in spec.start
        )
        if total > 0:
            return total
    return sum(o.layers * o.min_area for o in spec.ops) / spec.devices or 1.0


def build(spec: WaveModelSpec, solver: str = "highs") -> _Built:
    """Build the model (no solving); names on constraints make ``model.write`` readable."""
    model = new_model("waves", solver)
    scale = _scale(spec)
    wins = windows(spec)
    W = spec.waves
    x: dict[tuple[int, int, int], Any] = {}
    y: dict[tuple[int, int, int], Any] = {}
    d = [model.add_var(f"d_{w}", lb=0.0) for w in range(W)]
    phases = None  # each wave's forward and backward, where the ops split their time unalike
    if len({o.backward_share for o in spec.ops}) > 1:
        phases = tuple([model.add_var(f"{ph}_{w}", lb=0.0) for w in range(W)] for ph in "fb")
    load: list[list[Any]] = [[] for _ in range(W)]  # n * x per wave, for the device cap
    work: list[list[tuple[OpSpec, Any]]] = [[] for _ in range(W)]  # n T(n) y, for ``area``
    for i, op in enumerate(spec.ops):
        lo, hi = wins[i]
        own: list[Any] = []
        for w in range(lo, hi + 1):
            for n in spec.candidates[i]:
                x[i, w, n] = xv = model.add_var(f"x_{i}_{w}_{n}", var_type=mip.BINARY)
                y[i, w, n] = yv = model.add_var(
                    f"y_{i}_{w}_{n}", var_type=mip.INTEGER, ub=op.layers
                )
                model.add_constr(yv <= op.layers * xv, f"link_{i}_{w}_{n}")
                model.add_constr(yv >= xv, f"nonempty_{i}_{w}_{n}")
                own.append(yv)
                load[w].append(n * xv)
                if spec.lanes is not None:
                    work[w].append((op, n * op.t(n) / scale / spec.lanes * yv))
            model.add_constr(mip.xsum(x[i, w, n] for n in spec.candidates[i]) <= 1, f"one_{i}_{w}")
            busy = mip.xsum(op.t(n) / scale * y[i, w, n] for n in spec.candidates[i])
            if phases is None:
                model.add_constr(d[w] >= busy, f"dur_{i}_{w}")
            else:
                model.add_constr(phases[0][w] >= (1 - op.backward_share) * busy, f"fwd_{i}_{w}")
                model.add_constr(phases[1][w] >= op.backward_share * busy, f"bwd_{i}_{w}")
        model.add_constr(mip.xsum(own) == op.layers, f"cover_{i}")
    for w in range(W):
        if load[w]:
            model.add_constr(mip.xsum(load[w]) <= spec.devices, f"cap_{w}")
        if phases is not None:
            model.add_constr(d[w] >= phases[0][w] + phases[1][w], f"phases_{w}")
        if work[w]:
            wave_phases_at = None if phases is None else (phases[0][w], phases[1][w])
            add_area(model, work[w], d[w], wave_phases_at, f"area_{w}")
    _add_precedence(model, spec, wins, x, y)
    model.objective = mip.xsum(d) + mip.xsum(
        (ENTRY_PRICE + spec.ops[i].switch_s / scale) * v for (i, _, _), v in x.items()
    )
    built = _Built(model, spec, scale, x, y, d, phases)
    if spec.start is not None:
        _warm_start(built)
    return built


def _add_precedence(
    model: mip.Model, spec: WaveModelSpec, wins: list[tuple[int, int]], x: dict, y: dict
) -> None:
    index = {o.id: i for i, o in enumerate(spec.ops)}
    for i, op in enumerate(spec.ops):
        lo, hi = wins[i]
        for dep in op.deps:
            p = index.get(dep)
            if p is None:
                continue
            L = spec.ops[p].layers
            plo, _ = wins[p]
            for w in range(lo, hi + 1):
                act = [x[i, w, n] for n in spec.candidates[i]]
                before = [
                    y[p, ww, n]
                    for ww in range(plo, w)
                    for n in spec.candidates[p]
                    if (p, ww, n) in y
                ]
                model.add_constr(L * mip.xsum(act) <= mip.xsum(before), f"prec_{p}_{i}_{w}")


def _warm_start(b: _Built) -> None:
    """Feed ``spec.start`` to the solver as its first incumbent (every variable valued)."""
    spec = b.spec
    assert spec.start is not None and len(spec.start) <= spec.waves
    index = {o.id: i for i, o in enumerate(spec.ops)}
    vals: dict[tuple[int, int, int], int] = {}
    phases = [(0.0, 0.0, 0.0)] * spec.waves  # per wave: forward, backward, whole
    for w, wave in enumerate(spec.start):
        for p in wave:
            vals[index[p.op], w, p.n] = p.layers
        busy = ((spec.ops[index[p.op]], p) for p in wave)
        phases[w] = wave_phases(
            ((op, p.layers * op.t(p.n) / b.scale, p.n) for op, p in busy), spec.lanes
        )
    if any(k not in b.x for k in vals):
        return  # the start uses a wave or allocation the model does not have
    start = [(b.x[k], 1.0 if k in vals else 0.0) for k in b.x]
    start += [(b.y[k], float(vals.get(k, 0))) for k in b.y]
    if b.phases is None:
        start += [(b.d[w], whole) for w, (_, _, whole) in enumerate(phases)]
    else:
        start += [(b.d[w], max(f + bw, whole)) for w, (f, bw, whole) in enumerate(phases)]
        start += [(b.phases[j][w], ph[j]) for j in (0, 1) for w, ph in enumerate(phases)]
    b.model.start = start


def solve(b: _Built, time_limit_s: float) -> MilpResult:
    """Run the solver for at most ``time_limit_s`` and read the best solution found."""
    t0 = time.perf_counter()
    try:
        raw = b.model.optimize(max_seconds=max(time_limit_s, 0.05))
    except Exception:  # a solver error must not stop planning: the caller falls back
        wall = time.perf_counter() - t0
        return MilpResult(SolveStatus.ERROR, None, None, None, wall, (), 0, 0)
    wall = time.perf_counter() - t0
    status = _STATUS.get(raw, SolveStatus.ERROR)
    nvar, ncon = b.model.num_cols, b.model.num_rows
    if status not in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE) or b.model.num_solutions == 0:
        if status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
            status = SolveStatus.NO_SOLUTION
        return MilpResult(status, None, None, None, wall, (), nvar, ncon)
    waves = _read_solution(b)
    ops = {o.id: o for o in b.spec.ops}
    objective = sum(
        wave_seconds(((ops[p.op], p.layers * ops[p.op].t(p.n), p.n) for p in w), b.spec.lanes)
        for w in waves
    )
    value = b.model.objective_value
    bound = min(max(0.0, b.model.objective_bound or 0.0), value)
    gap = 0.0 if status is SolveStatus.OPTIMAL or value <= 0 else (value - bound) / value
    bound *= b.scale
    return MilpResult(status, objective, bound, gap, wall, waves, nvar, ncon)


def _read_solution(b: _Built) -> tuple[tuple[Piece, ...], ...]:
    spec = b.spec
    nxt = [0] * len(spec.ops)
    waves: list[tuple[Piece, ...]] = []
    for w in range(spec.waves):
        pieces = []
        for i, op in enumerate(spec.ops):
            for n in spec.candidates[i]:
                v = b.y.get((i, w, n))
                if v is None or v.x is None:
                    continue
                k = round(v.x)
                if k > 0:
                    pieces.append(Piece(op.id, nxt[i], nxt[i] + k, n))
                    nxt[i] += k
        if pieces:
            waves.append(tuple(pieces))
    return tuple(waves)


@collector_paused()
def solve_local(spec: WaveModelSpec, time_limit_s: float, solver: str) -> MilpResult:
    """Build and solve in this process."""
    return solve(build(spec, solver), time_limit_s)


def _trimmed(spec: WaveModelSpec) -> WaveModelSpec:
    """``spec`` with each op's curve cut to its candidate allocations and those of the warm
    start: the model reads no other point, and the worker process is sent a few kB instead
    of megabytes."""
    used = _used(spec.start or ())
    ops = []
    for op, cands in zip(spec.ops, spec.candidates, strict=True):
        ns = tuple(sorted({*cands, *(n for n in used.get(op.id, ()) if op.valid(n))}))
        ops.append(replace(op, ns=ns, seconds=tuple(op.t(n) for n in ns)))
    return replace(spec, ops=tuple(ops))


def solve_waves(
    spec: WaveModelSpec, time_limit_s: float, solver: SolverChoice | None = None
) -> MilpResult:
    """Build and solve, in the worker process unless ``solver.isolated`` is off.

    A crash or hang of the solver gives an ``ERROR`` result (the callers keep their start)
    and a ``SolverCrashWarning``.
    """
    solver = solver or SolverChoice()
    spec = _trimmed(spec)
    if not solver.isolated:
        return solve_local(spec, time_limit_s, solver.name)
    t0 = time.perf_counter()
    res = isolate.call_or_warn(
        solve_local, (spec, time_limit_s, solver.name), time_limit_s, "wave MILP"
    )
    if res is None:
        return MilpResult(SolveStatus.ERROR, None, None, None, time.perf_counter() - t0, (), 0, 0)
    return res


SPREAD = 2  # pareto points kept on each side of the continuous optimum
MAX_BINARIES = 2500  # above this the model is not built: it would not finish in the budget


def candidates(op: OpSpec, n_star: float, devices: int, extra: set[int]) -> tuple[int, ...]:
    """A few allocations for op: pareto points around n*, the smallest one, and ``extra``."""
    pts = [n for n in op.pareto if n <= devices]
    below = [i for i, n in enumerate(pts) if n <= n_star]
    i = below[-1] if below else 0
    keep = set(pts[max(0, i - SPREAD) : i + SPREAD + 2]) | {pts[0]}
    keep |= {n for n in extra if op.valid(n) and n <= devices}
    return tuple(sorted(keep))


def level_optima(problem: Problem) -> dict[str, float]:
    """Each op's continuous optimum in its level, over the cores where devices share fewer
    (``Problem.lanes``: no more run at once), around which ``candidates`` are taken."""
    out: dict[str, float] = {}
    for level in problem.levels:
        opt = level_optimum([problem.op(i) for i in level], problem.lanes or problem.devices)
        out.update(opt.n_star)
    return out


def _used(waves: Sequence[tuple[Piece, ...]]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for wave in waves:
        for p in wave:
            out.setdefault(p.op, set()).add(p.n)
    return out


def global_milp(
    problem: Problem,
    start: Schedule,
    n_star: dict[str, float],
    time_limit_s: float,
    solver: SolverChoice | None = None,
) -> MilpResult | None:
    """All waves at once with precedence, warm-started from ``start`` (so never worse than
    it), over a few allocations per MetaOp around its level's continuous optimum (``n_star``,
    ``level_optima``) and those ``start`` uses; None where the model would be too large or
    there is no time."""
    if time_limit_s <= 0:
        return None
    used = _used(start.waves)
    cands = tuple(
        candidates(o, n_star[o.id], problem.devices, used.get(o.id, set())) for o in problem.ops
    )
    if sum(len(c) for c in cands) * len(start.waves) > MAX_BINARIES:
        return None
    spec = WaveModelSpec(
        problem.ops,
        problem.devices,
        len(start.waves),
        cands,
        start=start.waves,
        lanes=problem.lanes,
    )
    return solve_waves(spec, time_limit_s, solver)
