"""A piece's device order keeps its input's rows where they are (``planner.evaluate.placement``),
and placement lists its groups so."""

from __future__ import annotations

import random

import numpy as np
import pytest

from spindle_dsl.cost.base import GradientLife, SliceMemory
from spindle_dsl.cost.comm import _shard_moves, busiest_bytes
from spindle_dsl.planner.evaluate import placement as placement_module
from spindle_dsl.planner.evaluate.ledger import PartLedger
from spindle_dsl.planner.evaluate.placement import Topology, kept_share, order_like, place
from spindle_dsl.planner.model.problem import OpSpec, Piece, Problem, Schedule


def _moved(source, dest) -> float:
    """The share of the batch that changes device, as the cost model prices it."""
    return sum(_shard_moves(list(source), list(dest)).values())


def test_the_same_devices_keep_their_order_and_nothing_moves():
    got = order_like(np.array([1, 4, 7]), np.array([7, 1, 4]))
    assert got.tolist() == [7, 1, 4]
    assert _moved([7, 1, 4], got) == 0.0


def test_a_shared_device_keeps_its_half():
    # sorted, (39, 58) moves both halves of a producer on (58, 59); (58, 39) only one
    got = order_like(np.array([39, 58]), np.array([58, 59]))
    assert got.tolist() == [58, 39]
    assert _moved([58, 59], got) == pytest.approx(0.5)
    assert _moved([58, 59], [39, 58]) == pytest.approx(1.0)


def test_a_group_with_nothing_shared_stays_sorted():
    assert order_like(np.array([2, 3]), np.array([0, 1])).tolist() == [2, 3]


@pytest.mark.parametrize("large", [False, True])
def test_never_moves_more_than_sorted_order(large, monkeypatch):
    if large:  # the numpy path, on small groups
        monkeypatch.setattr(placement_module, "SMALL_GROUPS", 0)
    rng = random.Random(7)
    gained = 0.0
    for _ in range(500):
        devices = rng.randint(2, 24)
        source = rng.sample(range(devices), rng.randint(1, devices))
        chosen = sorted(rng.sample(range(devices), rng.randint(1, devices)))
        got = order_like(np.array(chosen), np.array(source))
        assert sorted(got.tolist()) == chosen
        assert kept_share(np.array(source), got) == pytest.approx(1 - _moved(source, got))
        if not large:  # matched pair by pair, then checked against the sorted order: its
            # busiest device moves no more, and where it moves as much, no fewer rows stay
            mine = (round(busiest_bytes(1.0, source, got.tolist()), 9), _moved(source, got))
            theirs = round(busiest_bytes(1.0, source, chosen), 9)
            assert mine <= (theirs, _moved(source, chosen) + 1e-12)
        gained += _moved(source, chosen) - _moved(source, got)
    assert gained > 50  # of 500 re-shardings: the order keeps many rows sorted ids move


def test_placement_keeps_a_growing_pieces_rows_in_place():
    # a/m grows from 2 devices to 3 between its waves: placement keeps its two devices and
    # adds one, and lists them so that both keep the rows they hold (sorted, the second
    # device would hand a third of the batch on and take another third back)
    ns = (1, 2, 3, 4)
    ops = tuple(OpSpec(f"{t}/m", 2, (), ns, tuple(1.0 / n for n in ns)) for t in "ab")
    problem = Problem(ops, 4)
    sched = Schedule(
        "x",
        (
            (Piece("a/m", 0, 1, 2), Piece("b/m", 0, 1, 2)),
            (Piece("a/m", 1, 2, 3), Piece("b/m", 1, 2, 1)),
        ),
    )

    def slice_memory(op: str, n: int, first: int, end: int) -> SliceMemory:
        return SliceMemory((), 0, 0, 0, GradientLife(carried=False, bucket=0))

    topo = Topology(4, 4, 10**9, {}, {"a/m": 1.0, "b/m": 1.0})
    placed = place(problem, sched, topo, PartLedger(4, slice_memory))
    before, after = placed.waves[0][0].devices, placed.waves[1][0].devices
    assert set(before) < set(after)
    assert kept_share(before, after) == pytest.approx(2 / 3)
    assert kept_share(before, sorted(after)) == pytest.approx(1 / 2)
