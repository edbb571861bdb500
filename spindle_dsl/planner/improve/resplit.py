"""Re-split layers between the pieces of a schedule (python-mip), keeping everything else.

Cutting MetaOps at layer granularity loses time: a wave lasts as long as its longest piece,
and rounding each piece to whole layers (the paper's "align" step, or cutting a time-axis
schedule into waves) leaves the others short of it. With the waves, their pieces and the
pieces' allocations fixed, choosing how many layers each piece runs is a small integer
program that HiGHS or CBC solves quickly and whose LP relaxation is tight:

    min sum_w d_w   s.t.  d_w >= k_p * T_m(n_p)  for every piece p of wave w,
                          sum over the pieces p of m of k_p = L_m,  k_p integer >= 0.

Where the pieces split their time between forward and backward unalike (a frozen tower runs
forward only), a wave lasts its slowest forward plus its slowest backward
(``problem.wave_seconds``): then d_w >= f_w + b_w, f_w and b_w bounding each piece's share.
Where the devices share fewer cores (``Problem.lanes``), each phase (d_w where the pieces
split alike) also bounds the wave's device-seconds over the cores, sum_p n_p k_p T_m(n_p) /
lanes: the layers go where cores are free, not merely where devices are.

Any solution is a valid schedule again: a piece left with no layers is dropped, an op then
finishes no later than before and starts no earlier, so dependencies still hold. The solves
run in the isolated worker process (``isolate``) unless the solver choice says otherwise; if
the worker dies, the schedule comes back unchanged (with a ``SolverCrashWarning``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import mip

from spindle_dsl.planner.model.problem import (
    OpSpec,
    Piece,
    Problem,
    Schedule,
    wave_phases,
    wave_seconds,
)
from spindle_dsl.planner.solver import isolate
from spindle_dsl.planner.solver.choice import (
    SolverChoice,
    collector_paused,
    new_model,
    quiet_stdout,
)

GAP = 1e-2  # stop within 1% of the optimum: the solution comes at once, proving it is slow
Split = dict[tuple[int, int], int]  # (wave, position in the wave) -> layers


def add_area(
    model: mip.Model,
    work: list[tuple[OpSpec, Any]],
    duration: Any,
    phases: tuple[Any, Any] | None,
    name: str,
) -> None:
    """Shared cores (``area``): a wave's ``duration``, or each of its ``phases`` where the
    ops split their time unalike, at least its pieces' ``work`` (per piece: its op and its
    device-seconds over the cores, a linear expression), split by each op's backward share.
    The wave MILP (``improve.wave_milp``) adds the same constraint over its variables."""
    if phases is None:
        model.add_constr(duration >= mip.xsum(a for _, a in work), name)
        return
    forward = mip.xsum((1 - op.backward_share) * a for op, a in work)
    model.add_constr(phases[0] >= forward, f"{name}_f")
    model.add_constr(phases[1] >= mip.xsum(op.backward_share * a for op, a in work), f"{name}_b")


def _build(problem: Problem, sched: Schedule, scale: float, solver: str, integer: bool = True):
    """The model, its wave durations ``d``, layer counts ``k`` and, where the ops split their
    time between forward and backward unalike, each wave's phases (module docstring:
    d >= forward + backward, each bounding its share of every piece)."""
    model = new_model("resplit", solver)
    model.max_mip_gap = GAP
    W = len(sched.waves)
    d = [model.add_var(f"d_{w}", lb=0.0) for w in range(W)]
    shares = {problem.op(p.op).backward_share for wave in sched.waves for p in wave}
    phases = None
    if len(shares) > 1:
        phases = tuple([model.add_var(f"{ph}_{w}", lb=0.0) for w in range(W)] for ph in "fb")
    k: dict[tuple[int, int], mip.Var] = {}
    own: dict[str, list[mip.Var]] = {}
    for w, wave in enumerate(sched.waves):
        work = []  # per piece, its device-seconds over the shared cores (``area``)
        for j, p in enumerate(wave):
            op = problem.op(p.op)
            kind = mip.INTEGER if integer else mip.CONTINUOUS
            v = model.add_var(f"k_{w}_{j}", var_type=kind, lb=0, ub=op.layers)
            k[w, j] = v
            own.setdefault(p.op, []).append(v)
            busy = op.t(p.n) / scale * v
            if problem.lanes is not None:
                work.append((op, p.n / problem.lanes * busy))
            if phases is None:
                model.add_constr(d[w] >= busy, f"dur_{w}_{j}")
            else:
                model.add_constr(phases[0][w] >= (1 - op.backward_share) * busy, f"fwd_{w}_{j}")
                model.add_constr(phases[1][w] >= op.backward_share * busy, f"bwd_{w}_{j}")
        if phases is not None:
            model.add_constr(d[w] >= phases[0][w] + phases[1][w], f"phases_{w}")
        if work:
            wave_phases_at = None if phases is None else (phases[0][w], phases[1][w])
            add_area(model, work, d[w], wave_phases_at, f"area_{w}")
    for op_id, vs in own.items():
        model.add_constr(mip.xsum(vs) == problem.op(op_id).layers, f"cover_{op_id}")
    model.objective = mip.xsum(d)
    return model, d, k, phases


def _with_layers(sched: Schedule, layers: dict[tuple[int, int], int]) -> Schedule:
    nxt: dict[str, int] = {}
    waves = []
    for w, wave in enumerate(sched.waves):
        row = []
        for j, p in enumerate(wave):
            n_layers = layers[w, j]
            if n_layers > 0:
                first = nxt.get(p.op, 0)
                row.append(Piece(p.op, first, first + n_layers, p.n))
                nxt[p.op] = first + n_layers
        if row:
            waves.append(tuple(row))
    return Schedule(sched.name, tuple(waves), sched.status, sched.gap, sched.notes)


def _growth(
    problem: Problem, sched: Schedule, out, dur, key: tuple[int, int], alike: bool
) -> tuple[float, float]:
    """How much a piece's wave grows if the piece takes one more layer (then: how much the
    piece alone would outlast the wave, its slack when negative). ``alike``: every op splits
    its time alike, so a wave is its slowest piece (quick to update)."""
    w, j = key
    p = sched.waves[w][j]
    t = (out[key] + 1) * problem.op(p.op).t(p.n)
    grown = max(dur[w], t) if alike else _wave_time(problem, sched, out, w, more=j)
    return (max(0.0, grown - dur[w]), t - dur[w])


def _round(
    problem: Problem, sched: Schedule, frac: dict[tuple[int, int], float]
) -> dict[tuple[int, int], int]:
    """Round an LP split to whole layers, wave-aware.

    Every piece is rounded down, so no wave outgrows the LP; then each op's missing layers
    go, one at a time, to its piece whose wave grows least by taking one (slowest ops first,
    as their layers are the hardest to hide).
    """
    out = {key: int(v + 1e-9) for key, v in frac.items()}
    dur = _durations(problem, sched, out)
    shares = {problem.op(p.op).backward_share for wave in sched.waves for p in wave}
    alike = len(shares) <= 1 and problem.lanes is None  # on shared cores, the work counts too
    pieces: dict[str, list[tuple[int, int]]] = {}
    for w, wave in enumerate(sched.waves):
        for j, p in enumerate(wave):
            pieces.setdefault(p.op, []).append((w, j))
    order = sorted(
        pieces, key=lambda o: -max(problem.op(o).t(sched.waves[w][j].n) for w, j in pieces[o])
    )
    for op_id in order:
        op = problem.op(op_id)
        missing = op.layers - sum(out[key] for key in pieces[op_id])
        for _ in range(missing):
            key = min(pieces[op_id], key=lambda key: _growth(problem, sched, out, dur, key, alike))
            out[key] += 1
            w, j = key
            if alike:
                dur[w] = max(dur[w], out[key] * op.t(sched.waves[w][j].n))
            else:
                dur[w] = _wave_time(problem, sched, out, w)
    return out


def _wave_time(
    problem: Problem, sched: Schedule, layers: Split, w: int, more: int | None = None
) -> float:
    """How long wave ``w`` of ``sched`` lasts with ``layers`` per piece (``wave_seconds``),
    piece ``more`` taking one layer more."""
    return wave_seconds(
        (
            (problem.op(p.op), (layers[w, j] + (j == more)) * problem.op(p.op).t(p.n), p.n)
            for j, p in enumerate(sched.waves[w])
        ),
        problem.lanes,
    )


def _wave_phases(
    problem: Problem, sched: Schedule, layers: Split
) -> list[tuple[float, float, float]]:
    """Each wave's slowest forward, backward and piece with ``layers`` per piece."""
    return [
        wave_phases(
            (
                (problem.op(p.op), layers[w, j] * problem.op(p.op).t(p.n), p.n)
                for j, p in enumerate(wave)
            ),
            problem.lanes,
        )
        for w, wave in enumerate(sched.waves)
    ]


def _durations(problem: Problem, sched: Schedule, layers: Split) -> list[float]:
    return [_wave_time(problem, sched, layers, w) for w in range(len(sched.waves))]


@collector_paused()
def best_split(problem: Problem, sched: Schedule, time_limit_s: float, solver: str) -> Split:
    """The best layer split found within ``time_limit_s`` (in this process).

    First the LP relaxation, rounded cumulatively per op (fast at any size); then branch and
    bound, started from the better of that and ``sched``'s own split, for the time left.
    """
    t0 = time.perf_counter()
    scale = sched.compute_s(problem) or 1.0
    best = {(w, j): p.layers for w, wave in enumerate(sched.waves) for j, p in enumerate(wave)}
    best_s = sum(_durations(problem, sched, best))
    try:
        model, d, k, _ = _build(problem, sched, scale, solver, integer=False)
        with quiet_stdout():
            lp = model.optimize(max_seconds=time_limit_s)
        if lp == mip.OptimizationStatus.OPTIMAL:
            rounded = _round(problem, sched, {key: v.x or 0.0 for key, v in k.items()})
            rounded_s = sum(_durations(problem, sched, rounded))
            if rounded_s < best_s:
                best, best_s = rounded, rounded_s
        left = time_limit_s - (time.perf_counter() - t0)
        if left > 0.02:
            model, d, k, phases = _build(problem, sched, scale, solver)
            durs = _durations(problem, sched, best)
            start = [(v, float(best[key])) for key, v in k.items()]
            start += [(d[w], dur / scale) for w, dur in enumerate(durs)]
            if phases is not None:
                start += [
                    (phases[i][w], ph[i] / scale)
                    for w, ph in enumerate(_wave_phases(problem, sched, best))
                    for i in (0, 1)
                ]
            model.start = start
            status = model.optimize(max_seconds=left)
            if status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
                found = {key: round(v.x or 0.0) for key, v in k.items()}
                if _covers(problem, sched, found):
                    found_s = sum(_durations(problem, sched, found))
                    if found_s < best_s:
                        best, best_s = found, found_s
    except Exception:  # a solver error keeps the best split found so far
        pass
    return best


def _covers(problem: Problem, sched: Schedule, split: Split) -> bool:
    """Whether ``split`` gives every op all its layers (a solver's answer is checked, not
    trusted: tolerances can round an integer to one off)."""
    total: dict[str, int] = {}
    for (w, j), k in split.items():
        if k < 0:
            return False
        op = sched.waves[w][j].op
        total[op] = total.get(op, 0) + k
    return all(total.get(o.id, 0) == o.layers for o in problem.ops if o.id in total)


def _reduced(problem: Problem, sched: Schedule) -> Problem:
    """Just what a re-split reads: each op's layers and T(n) at the allocations ``sched``
    uses. What the worker process is sent: full curves of 1,024 allocations for 200 ops
    pickle to megabytes, this to a few kB."""
    used: dict[str, set[int]] = {}
    for wave in sched.waves:
        for p in wave:
            used.setdefault(p.op, set()).add(p.n)
    ops = []
    for op in problem.ops:
        if op.id in used:
            ns = tuple(sorted(used[op.id]))
            ops.append(replace(op, deps=(), ns=ns, seconds=tuple(op.t(n) for n in ns)))
    return Problem(tuple(ops), problem.devices, problem.lanes)


def resplit(
    problem: Problem, sched: Schedule, time_limit_s: float, solver: SolverChoice | None = None
) -> Schedule:
    """``sched`` with its layers re-divided between its pieces (or unchanged if no better)."""
    if not sched.waves or time_limit_s <= 0:
        return sched
    solver = solver or SolverChoice()
    if solver.isolated:
        args = (_reduced(problem, sched), sched, time_limit_s, solver.name)
        split = isolate.call_or_warn(best_split, args, time_limit_s, "layer re-split")
        if split is None:
            return sched
    else:
        split = best_split(problem, sched, time_limit_s, solver.name)
    if not _covers(problem, sched, split):
        return sched
    if sum(_durations(problem, sched, split)) >= sched.compute_s(problem) * (1 - 1e-9):
        return sched
    return _with_layers(sched, split)
