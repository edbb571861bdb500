"""Which allocations a curve lists: shard breakpoints, the cluster grid, step curves."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from spindle_dsl.cost.allocations import DENSE, StepCurve, cluster_grid, shard_breakpoints


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(0, 5000), limit=st.integers(1, 6000))
def test_shard_breakpoints_are_the_least_dp_of_each_shard_size(batch, limit) -> None:
    got = shard_breakpoints(batch, limit)
    shard = {}
    for dp in range(1, min(limit, max(batch, 1)) + 1):
        shard.setdefault(-(-batch // dp), dp)
    assert got == tuple(sorted(shard.values()))


def test_breakpoints_of_a_large_batch_are_few() -> None:
    assert len(shard_breakpoints(4_194_304, 65_536)) < 2 * 2048 + 2


def test_cluster_grid() -> None:
    grid = cluster_grid(65536, 8)
    assert set(range(1, DENSE + 1)) <= set(grid)
    assert 65536 in grid and 32768 in grid and 8 * 1024 in grid
    assert len(grid) < 200
    odd = cluster_grid(1000, 8)
    assert {1000, 500, 250, 125, 200, 8 * 125} <= set(odd)
    assert max(odd) == 1000
    assert cluster_grid(5, 8) == (1, 2, 3, 4, 5)


def test_step_curve_keeps_strict_improvements_and_answers_every_n() -> None:
    curve = StepCurve.of([(1, 10.0, "a"), (4, 6.0, "b"), (3, 7.0, "c"), (6, 6.0, "d")])
    assert curve.ns == (1, 3, 4)
    assert curve.at(2) == (10.0, "a") and curve.at(5) == (6.0, "b") and curve.at(99)[1] == "b"


def test_listed_thins_steps_beyond_dense_but_keeps_the_fastest() -> None:
    steps = [(n, 1000.0 / n, n) for n in range(1, 4097)]
    curve = StepCurve.of(steps)
    listed = curve.listed((1, 2), 4096)
    assert set(range(1, DENSE + 1)) <= set(listed)
    assert 4096 in listed
    assert len(listed) < 250
    times = [1000.0 / n for n in listed if n > DENSE][:-1]  # the fastest is kept regardless
    assert all(b <= a * (1 - 1 / 32) + 1e-12 for a, b in itertools.pairwise(times))


def test_pricing_does_not_grow_with_the_cluster(build_op, cluster, monkeypatch) -> None:
    """The analytic model prices the shard breakpoints of each tensor-parallel degree: the
    same few configurations on 4,096 devices as on 65,536 (beyond the batch nothing changes)."""
    from spindle_dsl.cost import analytic

    calls = []
    real = analytic.price
    monkeypatch.setattr(analytic, "price", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = {"layers": 12, "hidden": 384, "heads": 8, "patch": 14}
    op = build_op("vit", args, batch=400, tokens=257)
    counts = []
    for n in (4096, 65536):
        calls.clear()
        analytic.step_curve(op, cluster(n))
        counts.append(len(calls))
    assert counts[0] == counts[1] < 4 * 2 * 40  # tp degrees x about 2 sqrt(400)
