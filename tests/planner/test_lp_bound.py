"""The LP lower bound: hand-computed optima, below every schedule, above the old bound."""

from __future__ import annotations

import random
import warnings
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth import SynthCost, random_graph, random_problem

from spindle_dsl.cli.cmd_plan import summary, summary_text
from spindle_dsl.planner import make_plan
from spindle_dsl.planner.bound import lp_bound as lp_module
from spindle_dsl.planner.bound.floors import lower_bound_s
from spindle_dsl.planner.bound.lp_bound import (
    LpSolution,
    MemoryRoom,
    certify,
    curve_of,
    envelope,
    frontier,
    lp_bound,
    lp_input,
)
from spindle_dsl.planner.improve.polish import improve
from spindle_dsl.planner.model.problem import OpSpec, Problem
from spindle_dsl.planner.search.rounds import milp_schedule
from spindle_dsl.planner.solver.choice import SolverChoice
from spindle_dsl.planner.starts.baselines import BASELINES
from spindle_dsl.planner.starts.crosslevel import cpa_schedule
from spindle_dsl.planner.starts.wavefront import paper_schedule

IN_PROCESS = SolverChoice("highs", isolated=False)


def by_id(problem: Problem) -> dict[str, OpSpec]:
    return {o.id: o for o in problem.ops}


def op(op_id: str, layers: int, deps: tuple[str, ...], curve: dict[int, float]) -> OpSpec:
    ns = tuple(sorted(curve))
    return OpSpec(op_id, layers, deps, ns, tuple(curve[n] for n in ns))


def test_a_chain_costs_the_sum_of_its_fastest_layers():
    """Area is slack (0.8 s of 8 devices' time), so C = 2 * 1.2 + 3 * 2 = 8.4 s."""
    p = Problem(
        (op("a", 2, (), {1: 2.0, 2: 1.2}), op("b", 3, ("a",), {1: 3.0, 2: 2.0})),
        8,
    )
    b = lp_bound(p, solver=IN_PROCESS)
    assert b.seconds == pytest.approx(8.4, rel=1e-9)
    assert b.primal_s == pytest.approx(8.4, rel=1e-9)
    assert b.note is None


def test_two_parallel_ops_trade_time_for_area():
    """On 2 devices, a (T(1) = 2, T(2) = 1.25) beside b (1 s, one device only). With x the
    share of a's layer on 2 devices: C >= 2 - 0.75 x and C >= (2 + 0.5 x + 1) / 2, equal at
    x = 1/2: C = 13/8, above both the area bound (1.5) and the critical path (1.25)."""
    p = Problem((op("a", 1, (), {1: 2.0, 2: 1.25}), op("b", 1, (), {1: 1.0})), 2)
    assert lower_bound_s(p) == pytest.approx(1.5)
    assert lp_bound(p, solver=IN_PROCESS).seconds == pytest.approx(13 / 8, rel=1e-9)


def test_area_binds_when_ops_outnumber_devices():
    """Eight independent ops of T(1) = 4 on 4 devices: every allocation costs at least 4
    device-seconds, so C = 8 * 4 / 4 = 8 although each op alone takes at most 4 s."""
    curve = {1: 4.0, 2: 2.2, 4: 1.3}
    p = Problem(tuple(op(f"t{i}", 1, (), curve) for i in range(8)), 4)
    assert lp_bound(p, solver=IN_PROCESS).seconds == pytest.approx(8.0, rel=1e-9)


def test_micro_batches_multiply_the_bound():
    p = Problem((op("a", 1, (), {1: 2.0, 2: 1.25}), op("b", 1, (), {1: 1.0})), 2)
    one, three = (lp_bound(p, k, solver=IN_PROCESS) for k in (1, 3))
    assert three.seconds == pytest.approx(3 * one.seconds, rel=1e-12)
    assert three.area_path_s == pytest.approx(3 * one.area_path_s, rel=1e-12)


def test_frontier_keeps_the_lower_left_convex_vertices():
    """(T, nT): n=1 (4, 4), n=2 (2.2, 4.4), n=3 (1.9, 5.7) lies above the chord from n=2 to
    n=4 (1.6, 6.4), n=5 is slower than n=4 and costs more, n=6 (1.5, 9) is the fastest."""
    c = {1: 4.0, 2: 2.2, 3: 1.9, 4: 1.6, 5: 1.7, 6: 1.5}
    pts = frontier(curve_of(op("a", 1, (), c), 6))
    assert [n for n, _ in pts] == [6, 4, 2, 1]
    # allocations above the device count are not part of any plan
    assert [n for n, _ in frontier(curve_of(op("a", 1, (), c), 4))] == [4, 2, 1]


def test_envelope_bounds_each_setting():
    slow = Problem((op("a", 4, (), {1: 2.0, 2: 1.5}), op("b", 2, ("a",), {2: 1.0})), 2)
    fast_small = Problem((op("a", 4, (), {1: 1.8}), op("b", 2, ("a",), {1: 1.9, 2: 1.2})), 2)
    both = envelope([slow, fast_small])
    assert both.op("a").ns == (1, 2) and both.op("a").seconds == (1.8, 1.5)
    merged = lp_bound(both, solver=IN_PROCESS).seconds
    assert merged <= lp_bound(slow, solver=IN_PROCESS).seconds * (1 + 1e-9)
    assert merged <= lp_bound(fast_small, solver=IN_PROCESS).seconds * (1 + 1e-9)


def test_a_failed_solve_falls_back_to_the_old_bound_with_a_note(monkeypatch):
    def broken(*_args):
        raise RuntimeError("no solver today")

    monkeypatch.setattr(lp_module, "solve_relaxation", broken)
    p = random_problem(random.Random(3), 8, 4)
    b = lp_bound(p, solver=IN_PROCESS)
    assert b.seconds is None and b.lower_bound_s == pytest.approx(lower_bound_s(p))
    assert "LP bound not solved" in b.note and "no solver today" in b.note


def jagged_problem(rng: random.Random, N: int, k: int) -> Problem:
    """Curves with holes, plateaus and slow-downs (measured curves are not smooth)."""
    ops = []
    for i in range(k):
        ns = sorted(rng.sample(range(1, N + 1), rng.randint(1, N)))
        t1 = rng.uniform(0.1, 3.0)
        secs = [t1 / n ** rng.uniform(0.2, 1.0) * rng.uniform(0.8, 1.3) for n in ns]
        deps = sorted({ops[j].id for j in range(i) if rng.random() < 0.3})[:3]
        ops.append(OpSpec(f"t{i}/m", rng.randint(1, 12), tuple(deps), tuple(ns), tuple(secs)))
    return Problem(tuple(ops), N)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 100_000),
    st.sampled_from([1, 2, 3, 8, 16, 40]),
    st.integers(1, 9),
    st.booleans(),
)
def test_lp_bound_lies_between_the_old_bound_and_every_schedule(seed, N, k, jagged):
    rng = random.Random(seed)
    p = jagged_problem(rng, N, k) if jagged else random_problem(rng, N, k)
    b = lp_bound(p, solver=IN_PROCESS)
    assert b.note is None and b.seconds is not None
    assert b.seconds >= lower_bound_s(p) * (1 - 1e-9)
    assert b.seconds == pytest.approx(b.primal_s, rel=1e-6)  # the certificate is tight
    scheds = [paper_schedule(p), cpa_schedule(p)] + [f(p) for f in BASELINES.values()]
    scheds.append(improve(p, scheds[0], 0.05, IN_PROCESS))
    for s in scheds:
        assert s.compute_s(p) >= b.seconds, s.name


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([2, 8, 16]), st.integers(2, 6))
def test_lp_bound_is_below_the_milp_schedule(seed, N, k):
    p = random_problem(random.Random(seed), N, k)
    assert milp_schedule(p, 0.2, solver=IN_PROCESS).compute_s(p) >= lp_bound(p).seconds


def random_duals(rng: random.Random, inp, nu: float = 0.0) -> LpSolution:
    """Dual weights of no particular merit (``certify`` must make any of them valid)."""
    return LpSolution(
        "optimal",
        1.0,
        rng.uniform(0, 1.5),
        tuple(rng.uniform(0, 1) for _ in inp.layers),
        tuple(tuple(rng.uniform(0, 2) for _ in deps) for deps in inp.deps),
        0.0,
        nu,
    )


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 100_000), st.integers(1, 7))
def test_any_dual_weights_give_a_valid_bound(seed, k):
    """Weak duality holds for whatever weights the solver returns: random ones, repaired by
    ``certify``, never exceed the LP optimum."""
    rng = random.Random(seed)
    p = jagged_problem(rng, 8, k)
    inp, curves = lp_input(p, lower_bound_s(p))
    sol = random_duals(rng, inp)
    assert certify(inp, curves, sol) <= lp_bound(p, solver=IN_PROCESS).primal_s * (1 + 1e-9)


def test_two_phases_bound_the_forward_and_the_backward_apart():
    """A frozen tower (forward only) beside a trained op, neither quicker on two devices: one
    phase sees a path of 1 s and an area of 1 s; the forward (1 s of the tower) and the
    backward (2/3 s of the trained op) cannot overlap, so the bound is 5/3 s, which the best
    plan (the two side by side) reaches, certified from the duals."""
    tower = OpSpec("a/tower", 1, (), (1, 2), (1.0, 1.0), backward_share=0.0)
    lm = OpSpec("b/lm", 1, (), (1, 2), (1.0, 1.0))
    p = Problem((tower, lm), 2)
    got = lp_bound(p, solver=IN_PROCESS)
    assert got.primal_s == pytest.approx(5 / 3)
    assert got.seconds == pytest.approx(5 / 3, rel=1e-6)
    assert milp_schedule(p, 0.5, solver=IN_PROCESS).compute_s(p) == pytest.approx(5 / 3)
    alike = Problem((replace(tower, backward_share=2 / 3), lm), 2)  # one phase, as before
    assert lp_bound(alike, solver=IN_PROCESS).seconds == pytest.approx(1.0, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 100_000), st.integers(2, 7))
def test_any_dual_weights_give_a_valid_bound_with_two_phases(seed, k):
    """Weak duality with each phase's weights repaired on their own: random duals for both
    phases never exceed the two-phase LP's optimum, which no plan beats."""
    rng = random.Random(seed)
    base = jagged_problem(rng, 8, k)
    shares = [rng.choice((0.0, 0.5, 2 / 3)) for _ in base.ops]
    shares[0], shares[-1] = 0.0, 2 / 3  # two phases for sure
    ops = tuple(replace(o, backward_share=s) for o, s in zip(base.ops, shares, strict=True))
    p = Problem(ops, 8)
    inp, curves = lp_input(p, lower_bound_s(p))
    assert inp.shares
    one, other = random_duals(rng, inp), random_duals(rng, inp)
    sol = replace(one, backward=(other.mu, other.ends, other.edges))
    best = lp_bound(p, solver=IN_PROCESS)
    assert certify(inp, curves, sol, lower_bound_s(p)) <= best.primal_s * (1 + 1e-9)
    assert best.seconds <= best.primal_s * (1 + 1e-9)
    assert milp_schedule(p, 0.2, solver=IN_PROCESS).compute_s(p) >= best.seconds * (1 - 1e-9)


@pytest.mark.parametrize("scheduler", ["default", "paper"])
def test_every_plan_reports_the_lp_bound(scheduler):
    graph = random_graph(random.Random(7), 16, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no solver failure, no fallback
        plan = make_plan(graph, SynthCost(graph.cluster), scheduler=scheduler, time_limit_s=0.3)
    bounds = plan.extra["bounds"]
    assert plan.lower_bound_s == bounds["lp_s"] >= bounds["area_path_s"]
    assert plan.lower_bound_s <= plan.iteration_s
    assert not any("LP bound not solved" in n for n in plan.notes)
    text = summary_text(summary(plan))
    assert (
        "LP relaxation" in text
        and f"iteration / bound = {plan.iteration_s / plan.lower_bound_s:.2f}x" in text
    )


def _holder_work(rng: random.Random, p: Problem) -> dict[str, float]:
    return {o.id: rng.uniform(0.0, 0.5) * min(o.seconds) for o in p.ops}


def _held(p: Problem, s, work: dict[str, float], k: int) -> float:
    """k x a schedule's compute plus its holder work averaged over the devices: what the LP
    with holder work bounds."""
    held = sum(q.layers * q.n * work[q.op] for w in s.waves for q in w) / p.devices
    return k * s.compute_s(p) + held


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([2, 8, 16, 40]), st.integers(1, 8))
def test_holder_work_lp_lies_below_every_schedule_and_above_the_plain_lp(seed, N, k):
    """With each layer's per-holder work priced in, the certified bound is below every
    schedule's k x compute plus that work over N, at least the plain LP, and tight."""
    rng = random.Random(seed)
    p = jagged_problem(rng, N, k)
    passes = rng.choice((1, 3))
    work = _holder_work(rng, p)
    plain = lp_bound(p, passes, IN_PROCESS)
    held = lp_bound(p, passes, IN_PROCESS, work)
    assert held.seconds is not None and held.seconds >= plain.seconds * (1 - 1e-9)
    assert held.seconds == pytest.approx(held.primal_s, rel=1e-6)
    scheds = [paper_schedule(p), cpa_schedule(p)] + [f(p) for f in BASELINES.values()]
    for s in scheds:
        assert _held(p, s, work, passes) >= held.seconds * (1 - 1e-9), s.name


def test_holder_work_makes_the_lp_prefer_fewer_holders():
    """Two independent ops, each with two allocations of equal device-seconds: area binds
    (C = 4 s either way) and holder work makes the wide one dearer, so the bound takes the
    narrow one and rises by its share exactly; alone, the narrow one would double the path,
    so the wide one stays and pays its own."""
    curve = {2: 1.0, 4: 0.5}
    p = Problem((op("a", 4, (), curve), op("b", 4, (), curve)), 4)
    assert lp_bound(p, solver=IN_PROCESS).seconds == pytest.approx(4.0)
    held = lp_bound(p, solver=IN_PROCESS, holder_work={"a": 0.1, "b": 0.1}).seconds
    assert held == pytest.approx(4.0 + 2 * 4 * 2 * 0.1 / 4, rel=1e-9)
    alone = Problem((op("a", 4, (), curve),), 4)
    held = lp_bound(alone, solver=IN_PROCESS, holder_work={"a": 0.1}).seconds
    assert held == pytest.approx(2.0 + 4 * 4 * 0.1 / 4, rel=1e-9)


def _grouped(p: Problem, s, work: dict[str, float], groups, k: int) -> float:
    """k x a schedule's compute plus its holder work over the devices, a group's at its
    widest member's layer-devices: what the LP with holder groups bounds."""
    layer_devices: dict[str, int] = {}
    for w in s.waves:
        for q in w:
            layer_devices[q.op] = layer_devices.get(q.op, 0) + q.layers * q.n
    alone = sum(n * work[op] for op, n in layer_devices.items() if op in work)
    widest = sum(w * max(layer_devices.get(op, 0) for op in ops) for ops, w in groups)
    return k * s.compute_s(p) + (alone + widest) / p.devices


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([2, 8, 16, 40]), st.integers(1, 8))
def test_holder_groups_lie_below_every_schedule_and_above_the_average(seed, N, k):
    """Ops grouped at random, each group weighed by its widest member: the certified bound
    is below every schedule's k x compute plus that work, tight, and at least the LP that
    gives each member the group's work over its size (the average)."""
    rng = random.Random(seed)
    p = jagged_problem(rng, N, k)
    passes = rng.choice((1, 3))
    ids = [o.id for o in p.ops]
    rng.shuffle(ids)
    size = rng.choice((2, 3))
    groups = [
        (tuple(ids[i : i + size]), rng.uniform(0.0, 0.5) * min(p.ops[0].seconds))
        for i in range(0, len(ids) - size + 1, size)
    ]
    grouped = {op for ops, _ in groups for op in ops}
    work = {o.id: rng.uniform(0.0, 0.5) * min(o.seconds) for o in p.ops if o.id not in grouped}
    average = {**work, **{op: w / len(ops) for ops, w in groups for op in ops}}
    held = lp_bound(p, passes, IN_PROCESS, work, holder_groups=groups)
    spread = lp_bound(p, passes, IN_PROCESS, average)
    assert held.seconds is not None and held.seconds >= spread.seconds * (1 - 1e-9)
    assert held.seconds == pytest.approx(held.primal_s, rel=1e-6)
    scheds = [paper_schedule(p), cpa_schedule(p)] + [f(p) for f in BASELINES.values()]
    for s in scheds:
        assert _grouped(p, s, work, groups, passes) >= held.seconds * (1 - 1e-9), s.name


def test_a_group_pays_for_its_widest_member_not_its_average():
    """Two ops over the same 8 layers, a heavy one that must run wide to meet the area bound
    (2.5 s) and a light one that can run on one device: the average charges each half the
    group's 0.2 s per layer-device (3.45 s), the group charges the heavy one's layer-devices
    whole (4.0 s: a on 4 devices for 11/12 of its layers, where C meets the area bound)."""
    a = op("a", 8, (), {1: 1.0, 4: 0.25})
    b = op("b", 8, (), {1: 0.25, 4: 0.0625})
    p = Problem((a, b), 4)
    assert lp_bound(p, solver=IN_PROCESS).seconds == pytest.approx(2.5)
    average = lp_bound(p, solver=IN_PROCESS, holder_work={"a": 0.1, "b": 0.1}).seconds
    assert average == pytest.approx(3.45, rel=1e-9)
    group = lp_bound(p, solver=IN_PROCESS, holder_groups=[(("a", "b"), 0.2)]).seconds
    assert group == pytest.approx(4.0, rel=1e-9)


def test_the_memory_room_forces_recompute_where_kept_bytes_must_shrink():
    """One op on one device, T = 2 s plain and 3 s recomputing; it keeps 10 bytes plain and
    2 recomputing in a room of 6: at least half of it must recompute (10 - 8 y <= 6), so
    C = 2 + 0.5 * 1 = 2.5 s; with room for 10 bytes nothing changes; with room for 1 byte
    no plan fits."""
    plain = Problem((op("a", 1, (), {1: 2.0}),), 1)
    rc = Problem((op("a", 1, (), {1: 3.0}),), 1)

    def bound(room: float):
        return lp_bound(
            plain, solver=IN_PROCESS, memory=MemoryRoom(by_id(rc), {"a": 10}, {"a": 2}, room)
        )

    assert bound(6).seconds == pytest.approx(2.5, rel=1e-9)
    assert bound(6).primal_s == pytest.approx(2.5, rel=1e-9)
    assert bound(10).seconds == pytest.approx(2.0, rel=1e-9)
    assert not bound(1).fits and bound(1).lower_bound_s == float("inf")


def test_an_op_one_device_cannot_hold_runs_recomputing_or_wider():
    """a (T(1) = 2, T(2) = 1.25) beside b (1 s, one device only) on 2 devices: 13/8 with
    every allocation (above). If one device cannot hold a without recompute, a runs on one
    device only recomputing (T(1) = 2.5): every choice of a costs 2.5 device-seconds, so
    C >= (2.5 + 1) / 2 = 1.75 with any room. With a room of 2.5 bytes (a keeps 2 plain, 1
    recomputing, b keeps 1) half of a recomputes, on one device a share u of a's layer and
    on two (T = 1.6) the rest of that half: C = 1.425 + 0.9 u = 1.925 - 0.35 u at u = 0.4,
    C = 1.785."""
    p = Problem((op("a", 1, (), {1: 2.0, 2: 1.25}), op("b", 1, (), {1: 1.0})), 2)
    plain = {"a": op("a", 1, (), {2: 1.25}), "b": p.op("b")}
    rc = {"a": op("a", 1, (), {1: 2.5, 2: 1.6})}
    room = MemoryRoom(rc, {"a": 2.0, "b": 1.0}, {"a": 1.0}, 100.0, plain)
    offered = room.either(p)
    assert offered is not None and offered.op("a").seconds == (2.5, 1.25)
    assert lp_bound(p, solver=IN_PROCESS).seconds == pytest.approx(13 / 8, rel=1e-9)
    assert lp_bound(offered, solver=IN_PROCESS, memory=room).seconds == pytest.approx(1.75)
    tight = replace(room, room=2.5)
    held = lp_bound(offered, solver=IN_PROCESS, memory=tight)
    assert held.seconds == pytest.approx(1.785, rel=1e-9)
    assert held.primal_s == pytest.approx(1.785, rel=1e-9)
    # an op with no allocation on either setting: no plan can run it
    assert replace(room, plain={"b": p.op("b")}, recompute={}).either(p) is None


def _room_case(rng: random.Random, N: int, k: int):
    """A jagged problem, its recompute curves (each op slower by a random factor), kept
    bytes per op without and with recompute, and a recompute set drawn at random with a room
    that just holds it: the schedules of the problem whose ops in the set run on the
    recompute curves are plans the LP with that room must stay below."""
    p = jagged_problem(rng, N, k)
    slower = Problem(
        tuple(
            OpSpec(
                o.id, o.layers, o.deps, o.ns, tuple(t * rng.uniform(1.0, 1.6) for t in o.seconds)
            )
            for o in p.ops
        ),
        N,
    )
    kept = {o.id: rng.uniform(1.0, 10.0) for o in p.ops}
    kept_rc = {o.id: v * rng.uniform(0.1, 1.0) for o, v in zip(p.ops, kept.values(), strict=True)}
    chosen = {o.id for o in p.ops if rng.random() < 0.5}
    room = sum(kept_rc[i] if i in chosen else kept[i] for i in kept) * rng.uniform(1.0, 1.2)
    made = Problem(tuple(slower.op(o.id) if o.id in chosen else o for o in p.ops), N)
    return p, MemoryRoom(by_id(slower), kept, kept_rc, room), made


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([2, 8, 16]), st.integers(1, 7))
def test_the_memory_room_lies_below_every_plan_that_fits_it(seed, N, k):
    """Above the plain LP (it only adds a constraint), tight, and below every schedule of a
    recompute set whose kept bytes fit the room."""
    p, room, made = _room_case(random.Random(seed), N, k)
    plain = lp_bound(p, solver=IN_PROCESS)
    held = lp_bound(p, solver=IN_PROCESS, memory=room)
    assert held.fits and held.seconds is not None
    assert held.seconds >= plain.seconds * (1 - 1e-9)
    assert held.seconds == pytest.approx(held.primal_s, rel=1e-6)
    scheds = [paper_schedule(made), cpa_schedule(made)] + [f(made) for f in BASELINES.values()]
    for s in scheds:
        assert s.compute_s(made) >= held.seconds * (1 - 1e-9), s.name


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 100_000), st.integers(1, 7))
def test_any_dual_weights_give_a_valid_bound_with_a_memory_room(seed, k):
    """Weak duality with the room's dual too: random weights never exceed the LP optimum."""
    rng = random.Random(seed)
    p, room, _ = _room_case(rng, 8, k)
    if not room.binds():
        return
    inp, curves = lp_input(p, lower_bound_s(p), memory=room)
    sol = random_duals(rng, inp, rng.uniform(0, 3))
    best = lp_bound(p, solver=IN_PROCESS, memory=room).primal_s
    assert certify(inp, curves, sol, lower_bound_s(p)) <= best * (1 + 1e-9)


def test_shared_cores_bound_the_area_by_the_cores():
    """Eight independent ops of T(1) = 4 on 4 devices whose work 2 cores share: every
    allocation costs at least 4 core-seconds, and at most 2 run at once, so C = 16."""
    curve = {1: 4.0, 2: 2.2, 4: 1.3}
    p = Problem(tuple(op(f"t{i}", 1, (), curve) for i in range(8)), 4)
    assert lp_bound(p, solver=IN_PROCESS, lanes=2).seconds == pytest.approx(16.0, rel=1e-9)
    assert lower_bound_s(p, 2) == pytest.approx(16.0)


def _tiny(spec_dir, **overrides):
    from spindle_dsl.language import compile_file

    path = spec_dir / "tiny_mm.spindle"
    return compile_file(path, cluster_overrides=overrides).graph


def test_lanes_count_each_nodes_cores(spec_dir):
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.planner.evaluate.build import context
    from spindle_dsl.planner.model.levers import Levers

    def lanes(**overrides) -> int:
        graph = _tiny(spec_dir, **overrides)
        step = context(graph, make_cost_model(graph.cluster), Levers(1), enforce=False).step
        assert step is not None
        return step.lanes

    assert lanes(devices=4, cores=2) == 2
    assert lanes(devices=4, cores=4) == 4  # a core each: every device
    assert lanes(devices=6, devices_per_node=4, cores=3) == 3 + 2  # the last node has 2


@pytest.mark.parametrize("scheduler", ["default", "paper", *BASELINES])
def test_a_plan_on_shared_cores_stays_above_its_tighter_bound(spec_dir, scheduler):
    """4 CPU workers over 2 cores: the bound divides the work by the cores, stays below every
    scheduler's plan, and is tighter than the bound of the same job on a core each; the
    summary counts idle cores, not devices waiting for one."""
    from spindle_dsl.cost import make_cost_model

    plans = {}
    for cores in (2, 4):
        graph = _tiny(spec_dir, devices=4, cores=cores)
        plans[cores] = make_plan(
            graph, make_cost_model(graph.cluster), scheduler=scheduler, time_limit_s=0.3
        )
    shared, own = plans[2], plans[4]
    assert shared.extra["bounds"]["lanes"] == 2 and "lanes" not in own.extra["bounds"]
    assert shared.lower_bound_s <= shared.iteration_s
    assert shared.extra["bounds"]["lp_s"] > own.extra["bounds"]["lp_s"] * 1.2
    assert 0.0 <= shared.idle_share() < 1.0
    text = summary_text(summary(shared))
    assert "shared by 2 cores" in text and "the cores sit idle inside waves" in text


def test_the_default_plan_on_shared_cores_runs_near_the_lp(spec_dir):
    """tiny_mm on 4 workers over 2 cores: a scheduler blind to the sharing gave each LM
    three workers (compute 1.27x the LP bound, the entries' device-seconds 1.27x its);
    weighing each wave's work over the cores, the plan's compute stays within 1.10x."""
    from spindle_dsl.cost import make_cost_model

    graph = _tiny(spec_dir, devices=4, cores=2)
    plan = make_plan(graph, make_cost_model(graph.cluster), time_limit_s=0.3)
    over = plan.over_lp()
    assert over is not None
    compute, busy = over
    assert compute <= 1.10 and busy <= 1.10


def test_a_plan_says_why_workers_beyond_the_cores_run_nothing(spec_dir):
    """tiny_mm on 8 workers over 2 cores runs on a few of them; the plan says why."""
    from spindle_dsl.cost import make_cost_model

    graph = _tiny(spec_dir, devices=8, cores=2)
    plan = make_plan(graph, make_cost_model(graph.cluster), time_limit_s=0.3)
    used = {d for w in plan.waves for e in w.entries for d in e.devices}
    assert len(used) < 8
    note = next(n for n in plan.notes if "no MetaOp" in n)
    assert f"{8 - len(used)} of 8 workers" in note and "share 2 cores" in note
    own = _tiny(spec_dir, devices=2, cores=2)
    assert not any("no MetaOp" in n for n in make_plan(own, make_cost_model(own.cluster)).notes)
