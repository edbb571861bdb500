"""The paper's allocation steps: T^-1, the continuous optimum by bisection, bi-point."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth import random_problem, synth_op

from spindle_dsl.planner.model.problem import OpSpec, bipoint, inverse_time, level_optimum


def linear_op(op_id: str, layers: int, work: float, N: int) -> OpSpec:
    """Perfectly scalable: T(n) = work / n."""
    ns = tuple(range(1, N + 1))
    return OpSpec(op_id, layers, (), ns, tuple(work / n for n in ns))


def test_inverse_time_interpolates_between_valid_points():
    op = OpSpec("a", 1, (), (1, 2, 4), (8.0, 4.0, 3.0))
    assert inverse_time(op, 4.0) == pytest.approx(2.0)
    assert inverse_time(op, 3.5) == pytest.approx(3.0)  # halfway from 4 s to 3 s
    assert inverse_time(op, 16.0) == pytest.approx(0.5)  # time-sharing below one device
    assert inverse_time(op, 2.0) == float("inf")  # faster than the op can ever go


def _inverse_by_walk(op: OpSpec, per_layer_s: float) -> float:
    """T^-1 by walking the pareto points in turn: the definition the bisection must match."""
    pts = op.pareto
    if per_layer_s >= op.t(pts[0]):
        return pts[0] * op.t(pts[0]) / per_layer_s
    for lo, hi in itertools.pairwise(pts):
        if per_layer_s >= op.t(hi):
            return lo + (hi - lo) * (op.t(lo) - per_layer_s) / (op.t(lo) - op.t(hi))
    return float(pts[-1]) if per_layer_s >= op.t(pts[-1]) * (1 - 1e-9) else float("inf")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.001, 1.0), min_size=1, max_size=12),
    st.lists(st.floats(0.0005, 1.2), min_size=1, max_size=8),
)
def test_inverse_time_finds_the_same_segment_as_a_walk(seconds, asked):
    op = OpSpec("a", 3, (), tuple(range(1, 2 * len(seconds), 2)), tuple(seconds))
    for q in (*asked, *op.pareto_seconds):  # the pareto times themselves: the segments' ends
        assert inverse_time(op, q) == _inverse_by_walk(op, q)


def test_perfectly_scalable_ops_split_devices_by_work():
    ops = [linear_op("a", 10, 3.0, 16), linear_op("b", 10, 1.0, 16)]
    opt = level_optimum(ops, 16)
    assert opt.n("a") == pytest.approx(12.0, rel=1e-6)
    assert opt.n("b") == pytest.approx(4.0, rel=1e-6)
    assert opt.completion_s == pytest.approx(10 * 3.0 / 12, rel=1e-6)


def test_level_that_cannot_use_all_devices_finishes_at_its_floor():
    op = OpSpec("a", 4, (), (1, 2), (2.0, 1.0))
    opt = level_optimum([op], 8)
    assert opt.completion_s == pytest.approx(4.0)
    assert opt.idle == pytest.approx(6.0)


def test_bipoint_splits_layers_between_the_two_neighbouring_allocations():
    op = linear_op("a", 10, 1.0, 8)
    tuples = bipoint(op, 4.3)
    assert tuples == ((5, 3), (4, 7))
    assert sum(k for _, k in tuples) == 10
    assert bipoint(op, 4.0) == ((4, 10),)
    assert bipoint(op, 0.5) == ((1, 10),)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 64), st.integers(1, 8))
def test_continuous_optimum_uses_all_devices_and_bipoint_keeps_time(seed, N, k):
    rng = random.Random(seed)
    ops = [synth_op(f"t{i}/m", rng.randint(1, 30), (), N, rng.uniform(0.01, 1)) for i in range(k)]
    opt = level_optimum(ops, N)
    used = sum(n for _, n in opt.n_star)
    assert used <= N * (1 + 1e-6)
    if opt.idle <= 1e-9:
        assert used == pytest.approx(N, rel=1e-6)
    for o in ops:
        tuples = bipoint(o, opt.n(o.id))
        assert sum(k for _, k in tuples) == o.layers
        assert all(o.valid(n) for n, _ in tuples)
        # rounding to whole layers moves the time by at most one layer's difference
        t = sum(k * o.t(n) for n, k in tuples)
        slack = max(o.t(n) for n, _ in tuples)
        assert t <= max(opt.completion_s, o.layers * o.t(o.pareto[0])) + slack + 1e-12


def test_levels_of_a_random_problem_are_topological():
    p = random_problem(random.Random(3), 16, 12)
    for op in p.ops:
        assert all(p.level[d] < p.level[op.id] for d in op.deps)
