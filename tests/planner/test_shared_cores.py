"""Schedulers on shared cores: where CPU workers outnumber the cores they run on
(``Problem.lanes``), a wave lasts at least its device-seconds over the cores, and the
schedulers weigh that instead of filling every device."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth import random_problem

from spindle_dsl.errors import PlanError
from spindle_dsl.planner.bound.floors import area_bound_s
from spindle_dsl.planner.improve.polish import improve, rebalance
from spindle_dsl.planner.improve.resplit import resplit
from spindle_dsl.planner.improve.wave_milp import WaveModelSpec, solve_local
from spindle_dsl.planner.model.levers import ALL_PASSES
from spindle_dsl.planner.model.problem import (
    OpSpec,
    Piece,
    Problem,
    Schedule,
    schedule_errors,
    wave_seconds,
)
from spindle_dsl.planner.search.rounds import milp_schedule, on_the_cores
from spindle_dsl.planner.solver.choice import SolverChoice
from spindle_dsl.planner.starts.wavefront import paper_schedule

IN_PROCESS = SolverChoice("highs", isolated=False)


def _pair(**kw) -> tuple[OpSpec, OpSpec]:
    """Two one-layer ops that run 1 s on a device and 0.6 s on two (1.2 device-seconds)."""
    return tuple(OpSpec(f"{t}/m", 1, (), (1, 2), (1.0, 0.6), task=t, **kw) for t in "ab")


def test_a_wave_on_shared_cores_lasts_its_work_over_the_cores():
    a, b = _pair()
    wide = [(a, 0.6, 2), (b, 0.6, 2)]  # 2.4 device-seconds
    assert wave_seconds(wide) == pytest.approx(0.6)  # a core each: the slowest piece
    assert wave_seconds(wide, lanes=2) == pytest.approx(1.2)
    assert wave_seconds([(a, 1.0, 1), (b, 1.0, 1)], lanes=2) == pytest.approx(1.0)
    # phases apart: a forward-only piece's work counts in the forward only
    tower = replace(a, backward_share=0.0)
    pieces = [(tower, 1.0, 1), (b, 0.9, 1)]  # forward 1.0 + 0.3, backward 0.6
    assert wave_seconds(pieces) == pytest.approx(1.6)
    assert wave_seconds(pieces, lanes=1) == pytest.approx(1.3 + 0.6)


def test_a_problem_checks_its_lanes():
    a, b = _pair()
    assert Problem((a, b), 4, 2).lanes == 2
    for bad in (0, 4, 5):
        with pytest.raises(PlanError, match="lanes"):
            Problem((a, b), 4, bad)


@pytest.mark.parametrize("lanes, seconds, n", [(None, 0.6, 2), (2, 1.0, 1)])
def test_the_wave_milp_gives_each_op_its_least_area_where_cores_are_few(lanes, seconds, n):
    """On 4 devices with a core each, both ops take 2 devices (0.6 s); over 2 cores those 4
    devices' 2.4 device-seconds take 1.2 s, so each op keeps one device (1.0 s)."""
    spec = WaveModelSpec(_pair(), 4, 1, ((1, 2), (1, 2)), lanes=lanes)
    res = solve_local(spec, 5.0, "highs")
    assert res.objective_s == pytest.approx(seconds)
    assert {p.n for w in res.waves for p in w} == {n}


def test_resplit_fills_the_cores_a_lone_piece_leaves_idle():
    """Over 2 cores, a wave with one piece on one device leaves a core idle: the re-split
    moves that op's layers into the wave beside the 4-device op, where they share the cores
    (all of b there: 4 + 4 device-seconds, 4 s, against 3 + 2 s as given)."""
    ns = (1, 4)
    a = OpSpec("a/m", 4, (), ns, (1.0, 0.25))
    b = OpSpec("b/m", 4, (), ns, (1.0, 0.25))
    shared = Problem((a, b), 5, 2)
    sched = Schedule(
        "x",
        (
            (Piece("a/m", 0, 4, 4), Piece("b/m", 0, 2, 1)),  # 4 + 2 device-seconds: 3 s
            (Piece("b/m", 2, 4, 1),),  # 2 s on one of the two cores
        ),
    )
    assert sched.compute_s(shared) == pytest.approx(5.0)
    after = resplit(shared, sched, 2.0, IN_PROCESS)
    assert schedule_errors(shared, after) == []
    assert after.compute_s(shared) == pytest.approx(4.0)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([(4, 2), (8, 2), (12, 5)]), st.integers(1, 7))
def test_the_schedulers_stay_valid_above_the_area_and_never_lose_to_their_start(seed, nl, k):
    N, lanes = nl
    p = replace(random_problem(random.Random(seed), N, k), lanes=lanes)
    start = paper_schedule(p)
    for s in (improve(p, start, 0.1, IN_PROCESS), rebalance(p, start)):
        assert schedule_errors(p, s) == []
        assert s.compute_s(p) <= start.compute_s(p) * (1 + 1e-9)
        assert s.compute_s(p) >= area_bound_s(p) * (1 - 1e-9)
    best = milp_schedule(p, 0.3, solver=IN_PROCESS)
    assert schedule_errors(p, best) == []
    assert best.compute_s(p) <= start.compute_s(p) * (1 + 1e-9)


def test_the_milp_scheduler_leaves_devices_idle_rather_than_share_cores():
    """The pair of ops on 4 devices: with a core each, 2 devices each (0.6 s); over 2 cores
    that plan takes 1.2 s, and the scheduler keeps one device each (1.0 s)."""
    blind, shared = Problem(_pair(), 4), Problem(_pair(), 4, 2)
    s = milp_schedule(shared, 1.0, solver=IN_PROCESS)
    assert schedule_errors(shared, s) == []
    assert s.compute_s(shared) == pytest.approx(1.0)
    assert {p.n for w in s.waves for p in w} == {1}
    assert milp_schedule(blind, 1.0, solver=IN_PROCESS).compute_s(shared) == pytest.approx(1.2)


def test_on_the_cores_keeps_the_allocations_that_fit_the_cores():
    ops = (
        OpSpec("a/m", 2, (), (1, 2, 4), (1.0, 0.55, 0.3)),
        OpSpec("b/m", 1, ("a/m",), (1, 3), (1.0, 0.4)),
    )
    cores = on_the_cores(Problem(ops, 4, 2))
    assert cores is not None and cores.devices == 2 and cores.lanes is None
    assert [o.ns for o in cores.ops] == [(1, 2), (1,)]
    assert on_the_cores(Problem(ops, 4)) is None  # a core each: nothing to restrict
    wide = (OpSpec("c/m", 1, (), (3, 4), (1.0, 0.8)),)  # needs 3 devices (memory, say)
    assert on_the_cores(Problem(wide, 4, 2)) is None


def test_the_milp_scheduler_keeps_the_plan_on_the_cores_where_the_placed_plan_is_quicker():
    """The placed plan prices what the schedulers do not (here: 0.1 s per busy device, as
    wider reductions cost): the run on as many workers as cores wins and says so."""
    ops = tuple(OpSpec(f"t{i}/m", 2, (), (1, 2, 4), (1.0, 0.5, 0.25)) for i in range(2))
    shared = Problem(ops, 4, 2)

    def placed(s: Schedule) -> tuple[float, float]:
        return 0.0, s.compute_s(shared) + 0.1 * max(sum(p.n for p in w) for w in s.waves)

    s = milp_schedule(shared, 1.0, placed, IN_PROCESS)
    assert schedule_errors(shared, s) == []
    assert max(sum(p.n for p in w) for w in s.waves) <= 2
    assert any("planned on 2 of the 4 workers" in n for n in s.notes)
    off = milp_schedule(shared, 1.0, placed, IN_PROCESS, ALL_PASSES.without("on_cores"))
    assert placed(s) <= placed(off)
