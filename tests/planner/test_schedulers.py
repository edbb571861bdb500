"""Every scheduler returns a valid wave schedule; the improvements never lose to their start."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth import random_problem, synth_op

from spindle_dsl.planner.bound.floors import level_reference_s, lower_bound_s
from spindle_dsl.planner.improve.polish import improve, polish, rebalance
from spindle_dsl.planner.improve.resplit import resplit
from spindle_dsl.planner.model.problem import OpSpec, Piece, Problem, Schedule, schedule_errors
from spindle_dsl.planner.search.rounds import milp_schedule
from spindle_dsl.planner.solver.choice import SolverChoice
from spindle_dsl.planner.starts.baselines import BASELINES, waveify
from spindle_dsl.planner.starts.crosslevel import cpa_schedule
from spindle_dsl.planner.starts.layout import Span
from spindle_dsl.planner.starts.wavefront import paper_schedule

IN_PROCESS = SolverChoice("highs", isolated=False)


def test_paper_on_two_equal_ops_runs_them_side_by_side():
    ns = tuple(range(1, 9))
    ops = tuple(OpSpec(f"t{i}/m", 8, (), ns, tuple(1.0 / n for n in ns)) for i in range(2))
    p = Problem(ops, 8)
    s = paper_schedule(p)
    assert s.waves == ((Piece("t0/m", 0, 8, 4), Piece("t1/m", 0, 8, 4)),)
    assert s.compute_s(p) == pytest.approx(level_reference_s(p))


def test_rebalance_shortens_a_lopsided_wave():
    ns = tuple(range(1, 9))
    a = OpSpec("a/m", 4, (), ns, tuple(1.0 / n for n in ns))
    b = OpSpec("b/m", 4, (), ns, tuple(1.0 / n for n in ns))
    p = Problem((a, b), 8)
    s = Schedule("x", ((Piece("a/m", 0, 4, 1), Piece("b/m", 0, 4, 7)),))
    r = rebalance(p, s)
    assert r.compute_s(p) == pytest.approx(1.0)
    assert schedule_errors(p, r) == []


def test_waveify_cuts_at_span_ends_and_keeps_deps():
    ns = (1, 2)
    a = OpSpec("t/a", 4, (), ns, (1.0, 0.5))
    b = OpSpec("t/b", 2, ("t/a",), ns, (1.0, 0.5))
    c = OpSpec("u/c", 3, (), ns, (1.0, 0.5))
    p = Problem((a, b, c), 3)
    spans = [Span(a, 2, 0.0, 2.0), Span(b, 2, 2.0, 3.0), Span(c, 1, 0.0, 3.0)]
    s = Schedule("w", waveify(spans))
    assert schedule_errors(p, s) == []
    assert len(s.waves) == 2


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([1, 2, 3, 8, 16, 40]), st.integers(1, 9))
def test_every_heuristic_schedule_is_valid_and_above_the_bound(seed, N, k):
    p = random_problem(random.Random(seed), N, k)
    lb = lower_bound_s(p)
    scheds = [paper_schedule(p), cpa_schedule(p)] + [f(p) for f in BASELINES.values()]
    for s in scheds:
        assert schedule_errors(p, s) == [], s.name
        assert s.compute_s(p) >= lb * (1 - 1e-9), s.name
        for improved in (improve(p, s, 0.05, IN_PROCESS), rebalance(p, s)):
            assert schedule_errors(p, improved) == [], s.name
            assert improved.compute_s(p) <= s.compute_s(p) * (1 + 1e-9)


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([2, 8, 16]), st.integers(2, 7))
def test_milp_is_valid_and_never_worse_than_paper(seed, N, k):
    p = random_problem(random.Random(seed), N, k)
    m = milp_schedule(p, 0.3)
    assert schedule_errors(p, m) == []
    assert m.compute_s(p) <= paper_schedule(p).compute_s(p) * (1 + 1e-9)
    assert m.status in ("optimal", "feasible", "heuristic")


def test_milp_finds_the_optimum_of_a_small_level():
    """Three equal ops on 4 devices: one wave of 1+1+2 is worse than the best wave split."""
    ns = (1, 2, 3, 4)
    ops = tuple(OpSpec(f"t{i}/m", 6, (), ns, tuple(1.0 / n for n in ns)) for i in range(3))
    p = Problem(ops, 4)
    m = milp_schedule(p, 5.0)
    assert schedule_errors(p, m) == []
    # total work is 18 layer-device-seconds on 4 devices: 4.5 s is the area bound, reachable
    assert m.compute_s(p) == pytest.approx(4.5)
    assert m.compute_s(p) <= paper_schedule(p).compute_s(p)


def test_single_device_cluster_runs_everything_in_turn():
    p = Problem((synth_op("a/x", 3, (), 1, 0.1), synth_op("a/y", 2, ("a/x",), 1, 0.1)), 1)
    for s in (paper_schedule(p), milp_schedule(p, 0.2), *(f(p) for f in BASELINES.values())):
        assert schedule_errors(p, s) == []


def test_resplit_moves_layers_to_even_out_waves():
    ns = (1, 2)
    a = OpSpec("a/m", 8, (), ns, (1.0, 0.5))
    b = OpSpec("b/m", 8, (), ns, (1.0, 0.5))
    p = Problem((a, b), 2)
    # wave 0 runs a 6 layers beside b's 2; wave 1 the other way round: 6 + 6 seconds
    s = Schedule(
        "x",
        (
            (Piece("a/m", 0, 6, 1), Piece("b/m", 0, 2, 1)),
            (Piece("a/m", 6, 8, 1), Piece("b/m", 2, 8, 1)),
        ),
    )
    r = resplit(p, s, 1.0)
    assert schedule_errors(p, r) == []
    assert r.compute_s(p) == pytest.approx(8.0)  # 4 + 4 layers a wave each


def _towers_and_trainers() -> Problem:
    """Two frozen towers (forward only) and two trained ops, each 1 s on one device."""
    ns = (1, 2)
    frozen = [OpSpec(f"{t}/tower", 2, (), ns, (0.5, 0.3), backward_share=0.0) for t in "ab"]
    trained = [OpSpec(f"{t}/lm", 2, (), ns, (0.5, 0.3)) for t in "cd"]
    return Problem((*frozen, *trained), 2)


def test_a_wave_lasts_its_slowest_forward_plus_its_slowest_backward():
    """A pass runs the forwards, then the backwards: a tower beside a trained op keeps one
    rank waiting in each phase (1 s forward, then 2/3 s backward), two towers or two trained
    ops side by side do not."""
    p = _towers_and_trainers()
    mixed = Schedule(
        "x",
        (
            (Piece("a/tower", 0, 2, 1), Piece("c/lm", 0, 2, 1)),
            (Piece("b/tower", 0, 2, 1), Piece("d/lm", 0, 2, 1)),
        ),
    )
    assert mixed.durations(p) == pytest.approx((1 + 2 / 3, 1 + 2 / 3))
    alike = Schedule(
        "x",
        (
            (Piece("a/tower", 0, 2, 1), Piece("b/tower", 0, 2, 1)),
            (Piece("c/lm", 0, 2, 1), Piece("d/lm", 0, 2, 1)),
        ),
    )
    assert alike.compute_s(p) == pytest.approx(2.0)


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_the_schedulers_pair_pieces_that_split_their_time_alike(solver):
    """The ``milp`` scheduler prices both phases (its wave MILP, re-splits and rebalances):
    it puts the towers side by side, 2 s, where pairing each with a trained op costs 3.33 s
    (the two cost the same to a wave priced as its slowest piece whole)."""
    p = _towers_and_trainers()
    s = milp_schedule(p, 1.0, solver=solver)
    assert schedule_errors(p, s) == []
    assert s.compute_s(p) == pytest.approx(2.0)


def test_polish_merges_a_wave_that_only_costs_time():
    ns = (1, 2)
    a = OpSpec("a/m", 2, (), ns, (1.0, 0.5))
    b = OpSpec("b/m", 1, (), ns, (1.0, 0.5))
    p = Problem((a, b), 2)
    s = Schedule("x", ((Piece("a/m", 0, 2, 1),), (Piece("b/m", 0, 1, 1),)))
    polished = polish(p, s, lambda x: (0.0, x.compute_s(p) + 0.1 * len(x.waves)), 5.0)
    assert len(polished.waves) == 1
    assert schedule_errors(p, polished) == []


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([2, 8, 24]), st.integers(1, 8))
def test_improve_keeps_schedules_valid_and_never_slower(seed, N, k):
    p = random_problem(random.Random(seed), N, k)
    for s in (paper_schedule(p), cpa_schedule(p)):
        better = improve(p, s, 0.1)
        assert schedule_errors(p, better) == []
        assert better.compute_s(p) <= s.compute_s(p) * (1 + 1e-9)


def _lopsided(seconds_big: float) -> Problem:
    """multitask_clip's image_text task in miniature: an image encoder, a text encoder far
    slower than everything else, and an image head after the encoder (listed after the text
    encoder, as its level puts it)."""
    ns = tuple(range(1, 9))
    ops = (
        OpSpec("it/image_enc", 32, (), ns, tuple(0.27 / n for n in ns), task="it"),
        OpSpec("it/text_enc", 24, (), ns, tuple(seconds_big / n for n in ns), task="it"),
        OpSpec("at/audio_enc", 12, (), ns, tuple(0.06 / n for n in ns), task="at"),
        OpSpec("it/image_head", 1, ("it/image_enc",), ns, tuple(6e-5 for _ in ns), task="it"),
        OpSpec("at/audio_head", 1, ("at/audio_enc",), ns, tuple(5e-5 for _ in ns), task="at"),
    )
    return Problem(ops, 8)


@pytest.mark.parametrize("seconds_big", [1e15, 2e6, 0.5])
def test_a_short_op_after_a_very_long_one_keeps_its_waves(seconds_big):
    """A chain's 60 us head after up to 10^15 s of text encoder is below the float resolution
    of the time axis (and, from 10^5 s on, within any relative tolerance on it): every
    scheduler must still give it a wave, or the improvements cannot find it. Exact span
    times give it its wave at any magnitude."""
    p = _lopsided(seconds_big)
    for s in (BASELINES["optimus"](p), cpa_schedule(p), paper_schedule(p)):
        assert schedule_errors(p, s) == [], s.name
        assert schedule_errors(p, improve(p, s, 0.05, IN_PROCESS)) == []
    assert schedule_errors(p, milp_schedule(p, 0.3)) == []
