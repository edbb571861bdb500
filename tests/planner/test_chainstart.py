"""The start that runs the head of the critical chain alone first
(``planner.starts.crosslevel``)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from synth import random_problem

from spindle_dsl.planner.bound.floors import critical_chain, critical_path_s
from spindle_dsl.planner.model.problem import OpSpec, Problem, schedule_errors
from spindle_dsl.planner.starts.crosslevel import (
    chain_head,
    chain_head_schedule,
    task_parallel_schedule,
)


def _op(op_id: str, layers: int, seconds: float, deps: tuple[str, ...] = (), *, power: float = 1.0):
    """An op on 1..16 devices whose layer takes ``seconds / n**power`` (1: perfect scaling)."""
    ns = tuple(range(1, 17))
    return OpSpec(op_id, layers, deps, ns, tuple(seconds / n**power for n in ns), task=op_id[0])


def _flamingo_shaped() -> Problem:
    """Task c: a tower that scales well, a resampler, then a long LM that barely gains past a
    few devices; tasks a and b: short chains beside it (the shape of
    ``bench/specs/flamingo_like``)."""
    return Problem(
        (
            _op("c/tower", 24, 8.0),
            _op("a/enc", 6, 1.0),
            _op("b/enc", 8, 1.5),
            _op("c/sampler", 1, 16.0, ("c/tower",)),
            _op("a/lm", 16, 4.0, ("a/enc",), power=0.5),
            _op("b/lm", 16, 1.0, ("b/enc",), power=0.5),
            _op("c/lm", 16, 20.0, ("c/sampler",), power=0.3),
        ),
        16,
    )


def test_the_critical_chain_is_the_longest_path_at_each_ops_quickest():
    p = _flamingo_shaped()
    chain = critical_chain(p)
    assert chain == ["c/tower", "c/sampler", "c/lm"]
    # the path whose length the critical-path bound is
    length = sum(p.op(i).layers * p.op(i).min_time for i in chain)
    assert abs(length - critical_path_s(p)) <= 1e-12 * length


def test_the_head_runs_alone_first_each_op_on_its_quickest_allocation():
    p = _flamingo_shaped()
    s = chain_head_schedule(p)
    assert s is not None and schedule_errors(p, s) == []
    head = [w for w in s.waves[:2]]
    assert [[(x.op, x.first, x.end, x.n) for x in w] for w in head] == [
        [("c/tower", 0, 24, 16)],
        [("c/sampler", 0, 1, 16)],
    ]
    assert all(x.op not in ("c/tower", "c/sampler") for w in s.waves[2:] for x in w)


def test_it_is_quicker_than_the_task_layout_where_the_head_scales_and_the_tail_does_not():
    p = _flamingo_shaped()
    chain, tasks = chain_head_schedule(p), task_parallel_schedule(p)
    assert chain is not None
    assert chain.compute_s(p) < tasks.compute_s(p)


def test_no_start_where_the_chain_is_one_op():
    p = Problem((_op("a/x", 4, 1.0), _op("b/y", 2, 1.0)), 16)
    assert chain_head_schedule(p) is None


def test_the_head_stops_before_an_op_with_an_input_from_off_the_chain():
    p = Problem(
        (
            _op("c/a", 40, 1.0),
            _op("b/side", 4, 1.0),
            _op("c/b", 35, 1.0, ("c/a", "b/side")),
            _op("c/c", 25, 1.0, ("c/b",)),
        ),
        16,
    )
    assert critical_chain(p) == ["c/a", "c/b", "c/c"]
    assert chain_head(p) == ["c/a"]
    s = chain_head_schedule(p)
    assert s is not None and schedule_errors(p, s) == []


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 64), st.integers(1, 12))
def test_it_is_a_valid_schedule_of_any_problem(seed, N, n_ops):
    p = random_problem(random.Random(seed), N, n_ops)
    s = chain_head_schedule(p)
    if s is None:
        assert chain_head(p) == []
    else:
        assert schedule_errors(p, s) == []
