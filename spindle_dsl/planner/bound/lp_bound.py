"""The LP lower bound: the linear relaxation of malleable scheduling with precedence.

The LP. Each MetaOp m takes a convex combination ``x[m,n] >= 0``, ``sum_n x[m,n] = 1`` of
its valid allocations n (``OpSpec.ns``, n <= N); its duration is
``d_m = L_m sum_n x[m,n] T_m(n)`` and its device-seconds ``a_m = L_m sum_n x[m,n] n T_m(n)``.
Start times satisfy ``s_m >= s_p + d_p`` for every dep p, ``s_m >= 0``; and
``C >= s_m + d_m`` for every m, ``C >= sum_m a_m / N``. The bound is min C, times the number
of micro-batch passes k.

Why it bounds every plan of this cost model. Take a plan's waves (one micro-batch pass,
curves priced at the micro-batch size). Waves run back to back without overlap; a MetaOp
has at most one entry per wave, and runs its layers one after another, each layer on some
valid allocation n. Let ``x[m,n]`` be the fraction of m's layers run on n devices: a feasible
convex combination, with ``d_m`` = the sum of m's entries' times. Let ``s_m`` be the start of
m's first wave. Each entry lasts at most its wave, and m's waves lie between the start of
its first and the end of its last, so ``s_m + d_m <= end(last wave of m)``. A dep p ends in
a wave strictly before m's first, so ``s_p + d_p <= end(last wave of p) <= s_m``. C = the
sum of wave durations (compute) is at least the end of every wave, so ``C >= s_m + d_m``.
A wave of duration D holds entries on disjoint devices, at most N in all, each running
l layers on n devices for ``l T(n) <= D``, so N D >= the device-seconds of its entries, and
summed over waves ``N C >= sum_m a_m``. So compute_s >= the LP optimum; the plan's
iteration_s is at least k times its one-pass compute (transfers and gradient sync only add
time, and ``validate`` checks ``iteration_s >= micro_batches * compute``), hence the bound.
It is at least the simpler area / critical-path bound (``bounds.py``): ``a_m >= L_m min_n n T(n)``
and ``d_m >= L_m min_n T(n)`` for any x.

Only the lower convex hull matters. Each op's point set P = {(T(n), n T(n))} enters the LP
only through (d_m, a_m) in L_m conv(P), and both only ever appear on the small side of a
constraint (a smaller d_m or a_m keeps every constraint satisfied with the same s and C). Every
point of conv(P) is dominated componentwise by a point of its lower-left frontier (the part
of the boundary of conv(P) + R^2_+ ), a convex combination of two neighbouring vertices of
that frontier, which are points of P. So restricting x to those vertices (``frontier``)
leaves the optimum unchanged: on the 1,024-device, 50-task bench spec they are a few dozen
points per op at most, not 1,024.

A certified value, whatever the solver's tolerances. The LP's dual gives weights: mu >= 0
on the area constraint, g_m >= 0 on ``C >= s_m + d_m`` and f_pm >= 0 on each precedence
edge. For ANY such numbers with ``mu + sum g <= 1`` and, at every op, inflow
``sum_p f_pm <= phi_m := g_m + sum_c f_mc`` (outflow), every feasible solution (C >= 0)
has ``C >= mu A / N + sum_m g_m (s_m + d_m) >= mu A / N + sum_m phi_m d_m``: the difference
of the last two is ``sum_m g_m s_m - sum_(m->c) f_mc d_m``, and ``d_m <= s_c - s_m`` on each
edge makes it at least ``sum_m s_m (phi_m - inflow_m) >= 0``. Writing out d_m and A gives
``C >= sum_m L_m min_n T_m(n) (phi_m + mu n / N)`` (weak duality). ``certify`` repairs
the solver's duals into such numbers (in-edges scaled down where inflow exceeds outflow,
all scaled down if the total exceeds 1) and evaluates that minimum over *every* valid
allocation, not only the frontier, so the reported bound is valid even if the solver or the
frontier were wrong; at an optimal dual it equals the LP optimum (the bench and tests check
that it matches the primal value).

Holder work (``lp_bound(holder_work=w)``). Work paid once per step on every device holding
a layer (the optimizer's per-part work; ``step_floor`` says why a layer's holders are at
least the n it runs on) adds ``L_m w_m sum_n x[m,n] n / N`` to the objective: the bound is
then on k x compute plus that work's average over the devices. The same dual weights
certify it, each op's weight at n growing by ``w_m n / (k N)`` per pass, since every
feasible solution pays that term exactly. The 2-D frontier no longer suffices (n counts
apart from n T(n)); the LP takes the points quicker than every smaller n (``quicker``).

Two phases. A pass runs every wave's forward, then every backward, and a wave lasts its
slowest forward plus its slowest backward (``problem.wave_seconds``). Where the MetaOps split
their time unalike (``OpSpec.backward_share`` s_m: 0 for a frozen tower, 2/3 training), the LP
bounds each phase on its own: ``C_f`` and ``C_b`` with start times, end, precedence and area
constraints each, m's phase durations ``(1 - s_m) d_m`` and ``s_m d_m``, its device-seconds the
same shares of ``a_m``, one x for both (a piece runs both phases on its n), and the objective
``C_f + C_b``. The argument above holds per phase: lay the waves' forward phases back to back
(each F_w long, the slowest forward in it), and a MetaOp's forward shares lie inside its waves
there, deps strictly before, and N F_w covers the wave's forward device-seconds; the same for
the backward phases (B_w; a chain is as long backward as forward); the plan's compute is at
least the sum of F_w + B_w. Weak duality then holds phase by phase, each phase's duals repaired
on their own (``certify``), an op's weight at n the sum over the phases of its share times
that phase's weight. With one share for every op the two phases are the one-phase LP scaled
by 1 - s and s, so then it is solved as one LP (the same bound, half the constraints). A
frozen tower beside a trained MetaOp of the same length, neither quicker on more devices: 1 s
with one phase, 5/3 s with two.

Solving: python-mip with the planner's solver (HiGHS by default), in the isolated worker
process when the choice says so (``isolate``), since a native crash must not take planning
down; if the solve fails, ``lp_bound`` returns the area / critical-path bound with a note.

Micro-batches and memory levers. ``lp_bound(problem, micro_batches=k)`` bounds
plans made with ``problem``'s curves (priced at the micro-batch size ceil(B/k), recompute
as the plan has it, allocations those on which a layer fits) and k passes: it is the bound
for *that plan's* levers, which is what ``lower_bound_s <= iteration_s`` needs. A bound on
every plan the planner may make instead, whatever levers it picks, is
``min over k of k * LP(envelope of the curves of every lever setting for that k)``:
``envelope`` merges per op the points of each setting (recompute on or off, each ZeRO stage:
each setting changes T(n) and which n fit). That is valid for per-op and global levers
alike: every plan's points are among the envelope's, at equal or greater T(n), and the LP
optimum only falls when an op gains points or its T(n) fall (the same x stays feasible with
smaller d and a). The bound of the chosen k alone is *not* a bound on plans with another k.
``make_plan`` reports the min over the k its lever search tried (``search.make._lower_bound``):
below the plan (its k is among them), and a statement about the planner's choice.

Memory (``lp_bound(memory=MemoryRoom(...))``). The envelope ignores memory, so where memory
forces recompute at some k, the bound at that k is the LP of a plan no planner may make. A
valid constraint: a plan that fits holds, summed over its N devices, at most N x capacity,
and at least every parameter part's state once plus, per MetaOp m, the bytes m keeps for
backward and its loss tensors (``memfit.MemoryFloor``: the ledger adds kept activations up
per device, and data parallelism only splits them, with ceil rounding up). With recompute
per MetaOp (``PlanMetaOp.recompute``: all of m's layers or none), m keeps ``K_m`` or
``R_m < K_m`` and runs on the plain curve or the recompute curve at that k. So let m take a
convex combination over the points of both curves, y_m the weight on the recompute curve's,
and ask ``sum_m K_m (1 - y_m) + R_m y_m <= room`` (the cluster's bytes less the states): a
plan's own levers give a feasible point (y_m in {0, 1}, x as above), so the LP optimum stays
below it. The frontier reduction holds per curve (within one, the kept bytes are fixed).
The certificate takes the constraint's dual nu >= 0 too: every feasible solution has
``room - sum_m (kept bytes of its choice) >= 0``, so subtracting nu times it keeps
``C >= ...`` true, giving ``C >= -nu room + sum_m min over both curves and every n of
(L_m T(n) (phi_m + mu n / N) + nu x kept bytes of that curve)``, whatever nu is. Where even
``sum_m min(K_m, R_m)`` exceeds the room, no plan at that k fits, and the planner does not
take that k's LP into its least (it reports the plan's own k's bound in any case). ZeRO-2
changes neither side: the states are counted once under every stage, and its curves are no
quicker than ZeRO-1's. The constraint is the cluster's total only: what one device must hold
(a MetaOp's weights on every device it runs on) is not counted, so it stays a relaxation.

Shared cores (``lp_bound(lanes=...)``). Where a node's devices outnumber the cores they share
(CPU workers, ``cost.step.StepModel.lanes``), the step model times each phase of a wave as the
node's cores work through its devices' work (``cost.step.shared_makespan``: at most ``cores``
at a time, never quicker than the fair share), so a phase lasts at least its work over the
cluster's cores, and ``lanes C >= sum_m a_m`` holds with ``lanes`` (the cores, node by node,
each node at most its devices) in place of N: the area constraint and the holder work divide
by it, and so does the certificate. The memory room stays N devices' bytes. On 4 gloo workers
over 2 cores (``examples/tiny_mm.spindle``) the bound with N would call the plan far off and
its devices idle half the time, where they only share the cores.

One device (``MemoryRoom.plain``). The planner offers a MetaOp only the allocations on which
one device can hold it under the plan's levers (``build.offered_spec``), which depend on the
levers only through k, the ZeRO stage and whether that MetaOp recomputes
(``planner.search.memfit``). So ``plain`` and ``recompute`` may list, per op, only the allocations
some stage offers without and with recompute: a plan's entries run on those (by its own
choice of the lever, x and y as above), so the LP, which lets each op combine points of its
two curves, still has the plan's point. An op whose layers no device holds without
recompute at small n runs there only recomputing, which the room cannot see where the
cluster as a whole has bytes to spare. Where the room cannot bind, the LP runs on
``MemoryRoom.either``, each op's two curves merged (``envelope`` per op); the certificate
takes the restricted curves as they are, so it stays a bound on plans that use them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import mip
import numpy as np

from spindle_dsl.planner.bound.floors import lower_bound_s as area_path_bound_s
from spindle_dsl.planner.model.problem import OpSpec, Problem
from spindle_dsl.planner.solver import isolate
from spindle_dsl.planner.solver.choice import (
    SolverChoice,
    collector_paused,
    new_model,
    quiet_stdout,
)

LP_TIME_LIMIT_S = 5.0  # far above what it needs (milliseconds); a hang must still end
SAFETY = 1e-12  # relative margin against rounding in the certificate's own arithmetic


@dataclass(frozen=True)
class Curve:
    """One op's valid allocations (n <= N) and T(n) per layer, as arrays; ``kept``: the
    bytes the op keeps at the memory peak when run on this curve (one setting of its
    recompute lever; 0 without a memory room, ``MemoryRoom``)."""

    ns: np.ndarray
    seconds: np.ndarray
    kept: float = 0.0


@dataclass(frozen=True)
class MemoryRoom:
    """What device memory asks of every plan at one k, in the LP's terms (module docstring,
    "Memory"): ``recompute``, per op that may recompute, its curve doing so; ``kept`` and
    ``kept_recompute``, the bytes each op keeps for backward (and its loss tensors) summed
    over its devices, without and with recompute (``memfit.MemoryFloor``); ``room``, the
    cluster's bytes less every parameter part's state held once; ``plain``, per op, its
    curve without recompute, where one device can hold it so (module docstring, "One
    device"; an op absent runs only recomputing; None: the problem's curves, every op)."""

    recompute: Mapping[str, OpSpec]
    kept: Mapping[str, float]
    kept_recompute: Mapping[str, float]
    room: float
    plain: Mapping[str, OpSpec] | None = None

    def specs(self, op: OpSpec) -> list[tuple[OpSpec, float]]:
        """``op``'s settings a plan may run it on, each with the bytes it keeps: without
        recompute (``op`` itself unless ``plain`` says otherwise) where it can, and with
        recompute where that frees bytes."""
        kept = self.kept.get(op.id, 0.0)
        rc_kept = self.kept_recompute.get(op.id, kept)
        plain = op if self.plain is None else self.plain.get(op.id)
        rc = self.recompute.get(op.id) if rc_kept < kept else None
        out = [] if plain is None else [(plain, kept)]
        return out if rc is None else [*out, (rc, rc_kept)]

    def either(self, problem: Problem) -> Problem | None:
        """``problem``'s ops on the envelope of their settings (``merged``): the problem
        whose plain LP bounds every plan where the room cannot bind; None if some op has no
        setting at all (no plan can run it)."""
        ops = []
        for o in problem.ops:
            specs = [spec for spec, _ in self.specs(o)]
            if not specs:
                return None
            ops.append(merged(specs))
        return Problem(tuple(ops), problem.devices)

    def least_kept(self) -> float:
        """Bytes kept with recompute wherever it frees any: above ``room``, no plan fits."""
        return sum(min(v, self.kept_recompute.get(k, v)) for k, v in self.kept.items())

    def binds(self) -> bool:
        """Whether the constraint can bind: the ops keep more than ``room`` without
        recompute."""
        return sum(self.kept.values()) > self.room


@dataclass(frozen=True)
class LpInput:
    """What the worker process is sent: per op its layers, deps (indices into ``ops``, all
    earlier) and frontier points; times divided by ``scale`` so the solver sees numbers near
    1."""

    layers: tuple[int, ...]
    deps: tuple[tuple[int, ...], ...]
    points: tuple[tuple[tuple[int, float], ...], ...]  # (n, T(n) / scale) per op
    devices: int
    # per op: work per layer on each device holding it, once per step, over k and ``scale``
    # (``holder_work`` of ``lp_bound``); empty: none
    holder: tuple[float, ...] = ()
    # per op and point: the bytes the op keeps on that point's curve, over the room; empty:
    # no memory constraint (``MemoryRoom``)
    mem: tuple[tuple[float, ...], ...] = ()
    # per op: its backward's share of its time (``OpSpec.backward_share``), where the ops split
    # their time unalike: then the forward and the backward phase are bounded apart (module
    # docstring, "Two phases"); empty: one phase
    shares: tuple[float, ...] = ()
    # how many devices' work the cluster advances at once (module docstring, "Shared cores");
    # None: every device
    lanes: int | None = None
    # groups of ops (indices) weighed by their widest member, each with its work per layer
    # on each device holding it, once per step, over k and ``scale`` (``holder_groups`` of
    # ``lp_bound``); their ops have no ``holder`` work of their own
    groups: tuple[tuple[tuple[int, ...], float], ...] = ()

    @property
    def parallel(self) -> int:
        """What the area constraint and the holder work divide by: ``lanes``, else N."""
        return self.lanes or self.devices


@dataclass(frozen=True)
class LpSolution:
    """The solver's answer in plain values: the primal value (scaled units) and the duals."""

    status: str
    primal: float | None
    mu: float  # area constraint
    ends: tuple[float, ...]  # C >= s_m + d_m, per op
    edges: tuple[tuple[float, ...], ...]  # s_m >= s_p + d_p, per op, in the order of its deps
    wall_s: float
    nu: float = 0.0  # the memory room (``LpInput.mem``)
    # the backward phase's duals where ``LpInput.shares`` splits the phases (``mu``, ``ends``
    # and ``edges`` are then the forward phase's); None with one phase
    backward: tuple[float, tuple[float, ...], tuple[tuple[float, ...], ...]] | None = None
    # per group of ``LpInput.groups``, the duals of its members' constraints (the group's
    # variable above each member's layer-devices)
    group_duals: tuple[tuple[float, ...], ...] = ()


@dataclass(frozen=True)
class LpBound:
    """``seconds``: the certified LP bound (times k), None if the LP was not solved;
    ``primal_s``: the solver's LP value (times k), for comparison; ``area_path_s``: the area /
    critical-path bound (times k, ``bounds.py``); ``note``: why the LP was not used, or None."""

    seconds: float | None
    primal_s: float | None
    area_path_s: float
    micro_batches: int
    points: int  # frontier points in the LP, all ops together
    wall_s: float
    note: str | None = None
    fits: bool = True  # False: no plan at this k fits in memory (``MemoryRoom``)

    @property
    def lower_bound_s(self) -> float:
        """What a plan reports: the larger of the two bounds (equal to the LP's unless the
        LP failed: the LP is never below the area / critical-path bound)."""
        return max(self.seconds or 0.0, self.area_path_s)


def curve_of(op: OpSpec, devices: int) -> Curve:
    ns = np.fromiter(op.ns, dtype=np.int64, count=len(op.ns))
    secs = np.fromiter(op.seconds, dtype=np.float64, count=len(op.seconds))
    keep = ns <= devices
    return Curve(ns[keep], secs[keep])


def frontier(curve: Curve) -> tuple[tuple[int, float], ...]:
    """Vertices of the lower-left frontier of conv{(T(n), n T(n))}, by increasing T (see the
    module docstring for why the LP needs no other point)."""
    ts, areas = curve.seconds, curve.ns * curve.seconds
    order = np.lexsort((areas, ts))  # by T, then by area
    ts, areas, ns = ts[order], areas[order], curve.ns[order]
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], areas[:-1])))
    pareto = areas < best_before  # strictly less area than every faster-or-equal point
    hull: list[tuple[int, float, float]] = []
    rows = zip(ns[pareto].tolist(), ts[pareto].tolist(), areas[pareto].tolist(), strict=True)
    for n, t, a in rows:
        while len(hull) >= 2:
            (_, t1, a1), (_, t2, a2) = hull[-2], hull[-1]
            if (t2 - t1) * (a - a1) - (a2 - a1) * (t - t1) <= 0:  # not a strict left turn
                hull.pop()
            else:
                break
        hull.append((n, t, a))
    return tuple((n, t) for n, t, _ in hull)


def quicker(curve: Curve) -> tuple[tuple[int, float], ...]:
    """The points no other beats on n, T(n) and n T(n) at once: by increasing n, those
    quicker than every smaller allocation (a larger n that is not quicker has more of all
    three). With holder work the LP weighs n apart from n T(n), so the 2-D frontier is not
    enough; the certificate still takes every valid allocation."""
    out: list[tuple[int, float]] = []
    best = np.inf
    for n, t in sorted(zip(curve.ns.tolist(), curve.seconds.tolist(), strict=True)):
        if t < best:
            out.append((n, t))
            best = t
    return tuple(out)


def merged(specs: Sequence[OpSpec]) -> OpSpec:
    """One op's specs under several settings as one: the union of their allocations,
    keeping the least T(n) where several have n (the first spec's id, layers and deps)."""
    best: dict[int, float] = {}
    for o in specs:
        for n, s in zip(o.ns, o.seconds, strict=True):
            best[n] = min(s, best.get(n, s))
    ns = tuple(sorted(best))
    op = specs[0]
    return replace(op, ns=ns, seconds=tuple(best[n] for n in ns))


def envelope(problems: Sequence[Problem]) -> Problem:
    """Per op, the union of the allocations of several problems over the same ops (e.g. one
    per memory-lever setting at one k), keeping the least T(n) where several have n: the
    LP of the result bounds plans made with any of them (module docstring)."""
    ops = tuple(merged([p.op(op.id) for p in problems]) for op in problems[0].ops)
    return Problem(ops, max(p.devices for p in problems))


@collector_paused()
def solve_relaxation(inp: LpInput, solver: str) -> LpSolution:
    """Build and solve the LP (in whichever process calls it); duals read back as plain
    floats. With ``inp.shares``, one C, start times, end, precedence and area constraints per
    phase, the phases' durations and device-seconds the op's share of its own (module
    docstring, "Two phases")."""
    t0 = time.perf_counter()
    model = new_model("lp_bound", solver)
    N = inp.parallel
    k = len(inp.layers)
    # per phase, each op's share of its time: one phase of it all, or forward and backward
    cuts = [tuple(1.0 for _ in range(k))]
    if inp.shares:
        cuts = [tuple(1.0 - x for x in inp.shares), tuple(inp.shares)]
    Cs = [model.add_var(f"C_{ph}", lb=0.0) for ph in range(len(cuts))]
    # expressions built from coefficient lists: python-mip's operators make one object per
    # term, which at 1,024 devices would cost more than the solve
    d = [model.add_var(f"d_{m}", lb=0.0) for m in range(k)]  # d_m, defined below
    areas: list[tuple[list[mip.Var], list[float]]] = [([C], [1.0]) for C in Cs]
    objective_vars: list[mip.Var] = list(Cs)
    objective_coeffs: list[float] = [1.0] * len(Cs)
    room_vars: list[mip.Var] = []  # sum of the ops' kept bytes (over the room) <= 1
    room_coeffs: list[float] = []
    xs_of: list[list[mip.Var]] = []
    for m, (layers, pts) in enumerate(zip(inp.layers, inp.points, strict=True)):
        xs = [model.add_var(f"x_{m}_{n}", lb=0.0) for n, _ in pts]
        xs_of.append(xs)
        model.add_constr(mip.LinExpr(xs, [1.0] * len(xs)) == 1, f"conv_{m}")
        model.add_constr(
            mip.LinExpr([d[m], *xs], [-1.0, *(layers * t for _, t in pts)]) == 0, f"dur_{m}"
        )
        for (vars_, coeffs), cut in zip(areas, cuts, strict=True):
            vars_.extend(xs)
            coeffs.extend(-cut[m] * layers * n * t / N for n, t in pts)
        if inp.holder and inp.holder[m] > 0:
            objective_vars.extend(xs)
            objective_coeffs.extend(layers * n * inp.holder[m] / N for n, _ in pts)
        if inp.mem:
            room_vars.extend(xs)
            room_coeffs.extend(-b for b in inp.mem[m])
    ends_by_phase, edges_by_phase, area_cs = [], [], []
    for ph, (C, cut) in enumerate(zip(Cs, cuts, strict=True)):
        ends, edges = _add_phase(model, ph, C, cut, d, inp.deps)
        ends_by_phase.append(ends)
        edges_by_phase.append(edges)
        area_cs.append(model.add_constr(mip.LinExpr(*areas[ph]) >= 0, f"area_{ph}"))
    room_c = (
        model.add_constr(mip.LinExpr(room_vars, room_coeffs) >= -1.0, "room") if room_vars else None
    )
    group_cs = _add_groups(model, inp, xs_of, objective_vars, objective_coeffs)
    model.objective = mip.LinExpr(objective_vars, objective_coeffs)
    with quiet_stdout():
        status = model.optimize(max_seconds=LP_TIME_LIMIT_S)
    wall = time.perf_counter() - t0
    if status != mip.OptimizationStatus.OPTIMAL:
        return LpSolution(status.name.lower(), None, 0.0, (), (), wall)

    def dual(c: mip.Constr) -> float:
        return max(0.0, c.pi or 0.0)

    phases = [
        (
            dual(area_c),
            tuple(dual(c) for c in ends),
            tuple(tuple(dual(c) for c in row) for row in edges),
        )
        for area_c, ends, edges in zip(area_cs, ends_by_phase, edges_by_phase, strict=True)
    ]
    return LpSolution(
        "optimal",
        float(model.objective_value),
        *phases[0],
        wall,
        dual(room_c) if room_c is not None else 0.0,
        phases[1] if len(phases) > 1 else None,
        tuple(tuple(dual(c) for c in cs) for cs in group_cs),
    )


def _add_phase(
    model: mip.Model,
    ph: int,
    C: mip.Var,
    cut: tuple[float, ...],
    d: list[mip.Var],
    deps: tuple[tuple[int, ...], ...],
) -> tuple[list[mip.Constr], list[list[mip.Constr]]]:
    """One phase's start times, each op ending by ``C`` and starting after its deps end (its
    share ``cut`` of each op's duration ``d``); the end and precedence constraints, whose
    duals ``solve_relaxation`` reads back."""
    starts = [model.add_var(f"s_{ph}_{m}", lb=0.0) for m in range(len(d))]
    ends = [
        model.add_constr(
            mip.LinExpr([C, starts[m], d[m]], [1.0, -1.0, -cut[m]]) >= 0, f"end_{ph}_{m}"
        )
        for m in range(len(d))
    ]
    edges = [
        [
            model.add_constr(
                mip.LinExpr([starts[m], starts[q], d[q]], [1.0, -1.0, -cut[q]]) >= 0,
                f"prec_{ph}_{q}_{m}",
            )
            for q in op_deps
        ]
        for m, op_deps in enumerate(deps)
    ]
    return ends, edges


def _add_groups(
    model: mip.Model,
    inp: LpInput,
    xs_of: list[list[mip.Var]],
    objective_vars: list[mip.Var],
    objective_coeffs: list[float],
) -> list[list[mip.Constr]]:
    """Per holder group a variable h_g at least each member's device-layers,
    h_g >= L_m sum_n n x[m,n], its ``work`` over the devices added to the objective; the
    constraints, per group and member."""
    N = inp.parallel
    group_cs = []
    for gi, (members, work) in enumerate(inp.groups):
        h = model.add_var(f"h_{gi}", lb=0.0)
        objective_vars.append(h)
        objective_coeffs.append(work / N)
        group_cs.append(
            [
                model.add_constr(
                    mip.LinExpr(
                        [h, *xs_of[m]], [1.0, *(-inp.layers[m] * n for n, _ in inp.points[m])]
                    )
                    >= 0,
                    f"group_{gi}_{m}",
                )
                for m in members
            ]
        )
    return group_cs


def _repaired(
    inp: LpInput, mu: float, ends: Sequence[float], edges: Sequence[Sequence[float]]
) -> tuple[float, list[float], float]:
    """One phase's duals repaired into valid weights (module docstring): ``(mu, phi, norm)``,
    phi per op its outflow, all over ``norm`` so that mu plus the ends' weights stay within 1."""
    k = len(inp.layers)
    flows = [list(row) for row in edges]  # flows[m][j]: dep inp.deps[m][j] -> m
    out = [0.0] * k
    out_edges = [0.0] * k  # sum of f_mc over consumers c of m
    for m in reversed(range(k)):  # consumers come later: their in-edges are final first
        out[m] = ends[m] + out_edges[m]
        inflow = sum(flows[m])
        if inflow > out[m]:
            shrink = out[m] / inflow * (1 - SAFETY) if inflow > 0 else 0.0
            flows[m] = [f * shrink for f in flows[m]]
        for p, f in zip(inp.deps[m], flows[m], strict=True):
            out_edges[p] += f
    total = mu + sum(ends)
    norm = (1 + SAFETY) * total if total > 1 else 1.0
    return mu / norm, [o / norm for o in out], norm


def _group_weights(inp: LpInput, sol: LpSolution) -> dict[int, float]:
    """Per op in a group, the weight its layer-devices carry in the certificate: the
    duals of the group's constraints, repaired so that they sum to at most the group's own
    weight (its work over N). Any such weights make the group's term at least their sum of
    its members' layer-devices, since the group's variable is above each of them."""
    out: dict[int, float] = {}
    duals = sol.group_duals or tuple(() for _ in inp.groups)
    for (members, work), lams in zip(inp.groups, duals, strict=True):
        cap = work / inp.parallel
        lams = [max(0.0, x) for x in lams] or [0.0] * len(members)
        total = sum(lams)
        shrink = cap / total * (1 - SAFETY) if total > cap else 1.0
        for m, lam in zip(members, lams, strict=True):
            out[m] = lam * shrink
    return out


def certify(
    inp: LpInput, curves: Sequence[Sequence[Curve]], sol: LpSolution, scale: float = 1.0
) -> float:
    """The weak-duality bound (seconds, one pass) from ``sol``'s duals repaired into valid
    weights (module docstring), evaluated over every valid allocation of every curve an op
    may run on (``curves``: per op, one per setting of its recompute lever; ``scale``: what
    ``inp``'s times were divided by, to price its holder work and memory dual in seconds).
    With two phases, each phase's duals are repaired on their own and an op's weight at n is
    the sum over the phases of its share times that phase's weight."""
    k = len(inp.layers)
    phases = [(_repaired(inp, sol.mu, sol.ends, sol.edges), [1.0] * k)]
    if inp.shares and sol.backward is not None:
        phases = [
            (phases[0][0], [1.0 - x for x in inp.shares]),
            (_repaired(inp, *sol.backward), list(inp.shares)),
        ]
    norm = max(n for (_, _, n), _ in phases)
    nu = sol.nu / norm * scale if inp.mem else 0.0  # seconds per room
    group_weight = _group_weights(inp, sol)
    room = 1.0 if inp.mem else 0.0
    value = -nu * room
    for m, options in enumerate(curves):
        least = np.inf
        for curve in options:
            weights = np.zeros(len(curve.ns))
            for (mu, phi, _), cut in phases:
                weights = weights + cut[m] * curve.seconds * (phi[m] + mu * curve.ns / inp.parallel)
            if inp.holder:
                weights = weights + inp.holder[m] * scale * curve.ns / inp.parallel
            if m in group_weight:
                weights = weights + group_weight[m] * scale * curve.ns
            least = min(least, inp.layers[m] * float(weights.min()) + nu * curve.kept)
        value += least
    return max(0.0, value * (1 - SAFETY))


def lp_input(
    problem: Problem,
    scale: float,
    holder_work: Mapping[str, float] | None = None,
    micro_batches: int = 1,
    memory: MemoryRoom | None = None,
    lanes: int | None = None,
    holder_groups: Sequence[tuple[Sequence[str], float]] = (),
) -> tuple[LpInput, list[tuple[Curve, ...]]]:
    """The LP's input and, per op, the curves of its lever settings (one without
    ``memory``; with it, the plain curve and, where recompute frees bytes, the recompute
    curve, each carrying its kept bytes over the room)."""
    index = {o.id: i for i, o in enumerate(problem.ops)}
    curves: list[tuple[Curve, ...]] = []
    for o in problem.ops:
        if memory is None:
            curves.append((curve_of(o, problem.devices),))
            continue
        options = []
        for spec, kept in memory.specs(o):
            c = curve_of(spec, problem.devices)
            options.append(Curve(c.ns, c.seconds, kept / memory.room))
        curves.append(tuple(c for c in options if len(c.ns)))
    holder: tuple[float, ...] = ()
    groups: tuple[tuple[tuple[int, ...], float], ...] = ()
    pick = frontier
    k = max(1, micro_batches)
    if holder_work:
        holder = tuple(max(0.0, holder_work.get(o.id, 0.0)) / k / scale for o in problem.ops)
        pick = quicker
    if holder_groups:
        groups = tuple(
            (tuple(index[op] for op in ops), max(0.0, work) / k / scale)
            for ops, work in holder_groups
            if all(op in index for op in ops)
        )
        pick = quicker
    points = tuple(tuple((n, t / scale) for c in options for n, t in pick(c)) for options in curves)
    mem = (
        tuple(tuple(c.kept for c in options for _ in pick(c)) for options in curves)
        if memory is not None
        else ()
    )
    shares = tuple(o.backward_share for o in problem.ops)
    inp = LpInput(
        tuple(o.layers for o in problem.ops),
        tuple(tuple(index[d] for d in o.deps) for o in problem.ops),
        points,
        problem.devices,
        holder,
        mem,
        shares if len(set(shares)) > 1 else (),
        lanes if lanes and lanes < problem.devices else None,
        groups,
    )
    return inp, curves


def lp_bound(
    problem: Problem,
    micro_batches: int = 1,
    solver: SolverChoice | None = None,
    holder_work: Mapping[str, float] | None = None,
    memory: MemoryRoom | None = None,
    lanes: int | None = None,
    holder_groups: Sequence[tuple[Sequence[str], float]] = (),
) -> LpBound:
    """The LP bound for plans of ``problem`` run ``micro_batches`` passes per iteration (see
    the module docstring), certified by weak duality; the area / critical-path bound with a
    note if the LP cannot be solved.

    ``holder_work`` (per op id: seconds per layer on every device that holds the layer, once
    per step, e.g. the optimizer's per-part work, ``floors.StepFloor.holder_work``) adds that work
    averaged over the N devices to the objective: the bound is then on k x compute plus the
    busiest device's share of it, and the LP may trade wider allocations (more holders) for
    less of it. The certificate adds ``w_m n / N`` (over k) to op m's weight at n: every
    feasible solution pays at least that (module docstring), so it stays valid.

    ``memory`` (``MemoryRoom``) lets each op run on its recompute curve too, and asks that
    the bytes the ops keep fit in the room (module docstring, "Memory"); where even
    recomputing every op that frees bytes leaves them above it, no plan at this k fits, and
    the bound is infinite (``fits`` False).

    ``lanes`` (``StepModel.lanes``): how many devices' work the cluster advances at once,
    where CPU workers share fewer cores (module docstring, "Shared cores"); None: every
    device, as on GPUs (default: ``problem.lanes``).

    ``holder_groups`` ((op ids, seconds per layer on each device holding it) per group,
    ``floors.holder_groups``): ops that share all their layer parts and no other op runs,
    whose holder work is at least that of their widest member: a variable above each
    member's layer-devices carries it (``w / N`` each); the certificate adds the duals of
    those constraints, repaired to sum to at most ``w / N``, to the members' weights at n."""
    t0 = time.perf_counter()
    solver = solver or SolverChoice()
    lanes = lanes or problem.lanes
    k = micro_batches
    old = area_path_bound_s(problem, lanes)

    def without_lp(why: str, points: int = 0) -> LpBound:
        note = f"LP bound not solved ({why}); reporting the area / critical-path bound"
        return LpBound(None, None, old * k, k, points, time.perf_counter() - t0, note)

    if old <= 0:
        return without_lp("nothing to bound: no MetaOp takes time")
    if memory is not None and memory.least_kept() > memory.room:
        why = "no plan fits in memory at this number of micro-batches"
        return LpBound(math.inf, math.inf, old * k, k, 0, time.perf_counter() - t0, why, False)
    if memory is not None and (memory.room <= 0 or not memory.binds()):
        memory = None  # it cannot bind (or leaves no room to divide by): the plain LP
    inp, curves = lp_input(problem, old, holder_work, k, memory, lanes, holder_groups)
    if any(not options for options in curves):
        return without_lp("a MetaOp has no allocation within the devices")
    n_points = sum(len(p) for p in inp.points)
    try:
        if solver.isolated:
            timeout = LP_TIME_LIMIT_S + isolate.GRACE_S
            sol = isolate.call(solve_relaxation, (inp, solver.name), timeout)
        else:
            sol = solve_relaxation(inp, solver.name)
    except Exception as e:  # SolverCrash from the worker; any solver error in-process
        return without_lp(e.reason if isinstance(e, isolate.SolverCrash) else repr(e), n_points)
    if sol.primal is None:
        return without_lp(f"solver status {sol.status}", n_points)
    seconds = certify(inp, curves, sol, old) * k
    primal = sol.primal * old * k
    return LpBound(seconds, primal, old * k, k, n_points, time.perf_counter() - t0)


__all__ = [
    "LpBound",
    "MemoryRoom",
    "envelope",
    "frontier",
    "lp_bound",
    "merged",
    "solve_relaxation",
]
