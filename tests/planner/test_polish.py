"""Polish's wave dissolving, its compute cap, and the milp scheduler's use of several starts."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from synth import random_problem

from spindle_dsl.planner.bound.floors import level_reference_s
from spindle_dsl.planner.improve.polish import _dissolves, _wave_aligns, polish
from spindle_dsl.planner.improve.resplit import resplit
from spindle_dsl.planner.model.problem import OpSpec, Piece, Problem, Schedule, schedule_errors
from spindle_dsl.planner.search.rounds import COMPUTE_SLACK, milp_schedule
from spindle_dsl.planner.starts.wavefront import paper_schedule

NS = tuple(range(1, 9))


def _op(name: str, layers: int, power: float = 1.0) -> OpSpec:
    return OpSpec(name, layers, (), NS, tuple(1.0 / n**power for n in NS))


def test_dissolving_a_short_wave_wins_where_single_edits_cannot():
    a, b = _op("a/m", 4), _op("b/m", 4)
    p = Problem((a, b), 8)
    # a thin first wave: 1 layer of each on 2 devices (0.5 s), then 3 layers on 4 (0.75 s);
    # moving either piece alone lengthens the second wave more than it saves
    s = Schedule(
        "x",
        (
            (Piece("a/m", 0, 1, 2), Piece("b/m", 0, 1, 2)),
            (Piece("a/m", 1, 4, 4), Piece("b/m", 1, 4, 4)),
        ),
    )
    score = lambda x: (0.0, x.score(p))  # noqa: E731
    dissolved = list(_dissolves(p, list(s.waves)))
    assert all(schedule_errors(p, Schedule("d", tuple(w))) == [] for w in dissolved)
    polished = polish(p, s, score, 5.0)
    assert polished.waves == ((Piece("a/m", 0, 4, 4), Piece("b/m", 0, 4, 4)),)
    assert polished.compute_s(p) == pytest.approx(1.0)


def _heads_problem() -> tuple[Problem, Schedule]:
    """Two encoders on 3 and 5 of 8 devices, then their heads swapped (5 and 3): a full
    wave whose every piece moves its input."""
    enc_a, enc_b = _op("a/enc", 2), _op("b/enc", 2)
    head_a = OpSpec("a/head", 1, ("a/enc",), NS, tuple(0.01 / n for n in NS))
    head_b = OpSpec("b/head", 1, ("b/enc",), NS, tuple(0.01 / n for n in NS))
    p = Problem((enc_a, enc_b, head_a, head_b), 8)
    s = Schedule(
        "x",
        (
            (Piece("a/enc", 0, 2, 3), Piece("b/enc", 0, 2, 5)),
            (Piece("a/head", 0, 1, 5), Piece("b/head", 0, 1, 3)),
        ),
    )
    return p, s


def _moves(p: Problem, s: Schedule) -> int:
    """Waves with a piece on another allocation than its producer's (a boundary costs its
    busiest move, so one left is as bad as two)."""
    last = {q.op: q.n for w in s.waves for q in w if not p.op(q.op).deps}
    return sum(any(q.n != last[p.op(q.op).deps[0]] for q in w if p.op(q.op).deps) for w in s.waves)


def test_wave_align_moves_a_whole_wave_onto_its_producers_allocations():
    p, s = _heads_problem()
    aligned = list(_wave_aligns(p, list(s.waves)))
    assert (Piece("a/head", 0, 1, 3), Piece("b/head", 0, 1, 5)) in [w[1] for w in aligned]
    assert all(schedule_errors(p, Schedule("a", tuple(w))) == [] for w in aligned)
    score = lambda x: (0.0, x.compute_s(p) + _moves(p, x))  # noqa: E731
    polished = polish(p, s, score, 5.0)
    assert _moves(p, polished) == 0


def _over_full(heads: tuple[int, int]) -> Schedule:
    """The heads' producers needing 9 devices together (a's encoder ends on 5, b's on 4),
    the heads on ``heads`` devices: aligning the whole third wave cannot fit."""
    return Schedule(
        "x",
        (
            (Piece("a/enc", 0, 1, 4), Piece("b/enc", 0, 2, 4)),
            (Piece("a/enc", 1, 2, 5),),
            (Piece("a/head", 0, 1, heads[0]), Piece("b/head", 0, 1, heads[1])),
        ),
    )


def _third_waves(p: Problem, s: Schedule) -> list[tuple[Piece, ...]]:
    return [w[2] for w in _wave_aligns(p, list(s.waves)) if len(w) == 3]


def test_wave_align_skips_a_wave_that_would_not_fit():
    p, _ = _heads_problem()
    waves = _third_waves(p, _over_full((4, 4)))
    assert all(sum(q.n for q in w) <= 8 for w in waves)
    assert (Piece("a/head", 0, 1, 5), Piece("b/head", 0, 1, 4)) not in waves


def test_wave_align_keeps_the_costliest_inputs_in_place_where_not_all_fit():
    p, _ = _heads_problem()
    # b's encoder moves the most bytes (its ``switch_s``): where both producers' allocations
    # (5 + 4) do not fit, b's head keeps its 4 and a's head takes the 4 devices left
    ops = {o.id: o for o in p.ops}
    ops["a/enc"] = replace(ops["a/enc"], switch_s=0.1)
    ops["b/enc"] = replace(ops["b/enc"], switch_s=1.0)
    p = Problem(tuple(ops.values()), 8)
    s = _over_full((2, 6))
    waves = _third_waves(p, s)
    assert (Piece("a/head", 0, 1, 4), Piece("b/head", 0, 1, 4)) in waves
    assert all(schedule_errors(p, Schedule("a", (*s.waves[:2], w))) == [] for w in waves)


def test_wave_align_splits_an_over_full_wave_into_aligned_waves():
    p, _ = _heads_problem()
    s = _over_full((2, 6))  # producers on 5 + 4 of 8 devices: not both in one wave
    split = [w for w in _wave_aligns(p, list(s.waves)) if len(w) == 4]
    assert [tuple(w[2:]) for w in split] == [
        ((Piece("a/head", 0, 1, 5),), (Piece("b/head", 0, 1, 4),))
    ]
    assert schedule_errors(p, Schedule("s", tuple(split[0]))) == []
    # every piece on its producer's allocation, for one more short wave: the only align of
    # the heads that moves nothing (keeping the costliest input in place moves the other)
    assert _moves(p, Schedule("s", tuple(split[0]))) == 0
    assert all(_moves(p, Schedule("a", (*s.waves[:2], w))) for w in _third_waves(p, s))


def test_split_align_keeps_two_consumers_of_one_producer_apart():
    enc = _op("a/enc", 2)
    heads = [OpSpec(f"a/head{i}", 1, ("a/enc",), NS, tuple(0.01 / n for n in NS)) for i in (0, 1)]
    p = Problem((enc, *heads), 8)
    s = Schedule(
        "x",
        (
            (Piece("a/enc", 0, 2, 6),),
            (Piece("a/head0", 0, 1, 4), Piece("a/head1", 0, 1, 4)),
        ),
    )
    # both heads want the encoder's 6 devices: one wave each, both on them
    split = [w for w in _wave_aligns(p, list(s.waves)) if len(w) == 3]
    assert [tuple(w[1:]) for w in split] == [
        ((Piece("a/head0", 0, 1, 6),), (Piece("a/head1", 0, 1, 6),))
    ]


def test_wave_align_splits_a_wave_whose_producers_ran_in_different_waves():
    p, _ = _heads_problem()
    # a's encoder ends on 4 devices in the second wave, b's on 4 in the first: the heads on
    # 4 + 4 fit, but their producers' devices may overlap, so the wave may also become one
    # wave per producers' wave
    s = Schedule(
        "x",
        (
            (Piece("a/enc", 0, 1, 4), Piece("b/enc", 0, 2, 4)),
            (Piece("a/enc", 1, 2, 4),),
            (Piece("a/head", 0, 1, 2), Piece("b/head", 0, 1, 6)),
        ),
    )
    cands = list(_wave_aligns(p, list(s.waves)))
    assert (Piece("a/head", 0, 1, 4), Piece("b/head", 0, 1, 4)) in [w[2] for w in cands]
    assert [tuple(w[2:]) for w in cands if len(w) == 4] == [
        ((Piece("a/head", 0, 1, 4),), (Piece("b/head", 0, 1, 4),))
    ]


def test_dissolve_then_refine_rebalances_the_layers():
    a, b = _op("a/m", 6), _op("b/m", 2)
    p = Problem((a, b), 8)
    s = Schedule(
        "x",
        (
            (Piece("a/m", 0, 1, 4), Piece("b/m", 0, 1, 4)),
            (Piece("a/m", 1, 6, 6), Piece("b/m", 1, 2, 2)),
        ),
    )
    score = lambda x: (0.0, x.score(p))  # noqa: E731
    plain = polish(p, s, score, 5.0)
    refined = polish(p, s, score, 5.0, refine=lambda x: resplit(p, x, 1.0))
    assert schedule_errors(p, refined) == []
    assert refined.compute_s(p) <= plain.compute_s(p) * (1 + 1e-9)


def test_compute_cap_stops_trading_compute_for_fewer_waves():
    # superlinear curves: two ops side by side on half the devices each take longer than
    # one after the other on all of them, so merging the waves raises compute
    a, b = _op("a/m", 2, power=1.2), _op("b/m", 2, power=1.2)
    p = Problem((a, b), 8)
    s = Schedule("x", ((Piece("a/m", 0, 2, 8),), (Piece("b/m", 0, 2, 8),)))
    fewer_waves = lambda x: (0.0, float(len(x.waves)))  # noqa: E731
    free = polish(p, s, fewer_waves, 5.0)
    assert len(free.waves) == 1 and free.compute_s(p) > s.compute_s(p)
    capped = polish(p, s, fewer_waves, 5.0, compute_cap=s.compute_s(p))
    assert capped.waves == s.waves


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_milp_schedule_keeps_compute_within_the_cap_when_paper_does(seed):
    p = random_problem(random.Random(seed), 16, 7)
    cap = COMPUTE_SLACK * level_reference_s(p)
    s = milp_schedule(p, 0.6, lambda x: (0.0, x.score(p)))
    assert schedule_errors(p, s) == []
    if paper_schedule(p).compute_s(p) <= cap:
        assert s.compute_s(p) <= cap * (1 + 1e-9)
    assert any("kept the start from" in n for n in s.notes)
