"""The packed level-by-level start: short MetaOps in turn on shared devices
(``wavefront.packed_schedule``)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from synth import random_problem

from spindle_dsl.planner.bound.floors import level_reference_s, lower_bound_s
from spindle_dsl.planner.model.problem import OpSpec, Problem, schedule_errors
from spindle_dsl.planner.starts.baselines import balanced
from spindle_dsl.planner.starts.wavefront import pack_level, packed_schedule


def _op(op_id: str, layers: int, seconds: float, N: int) -> OpSpec:
    ns = tuple(range(1, N + 1))
    return OpSpec(op_id, layers, (), ns, tuple(seconds / n**0.9 for n in ns), task=op_id[0])


def _level(N: int = 8) -> Problem:
    """One large encoder and six small ones that one device runs in half the level: the large
    one takes 4 s on 5 devices, each small one 2 s on one device."""
    big = _op("a/big", 24, 4.0 * 5**0.9 / 24, N)
    small = [_op(f"{chr(98 + i)}/small", 4, 0.5, N) for i in range(6)]
    return Problem((big, *small), N)


def test_short_ops_share_a_device_in_turn():
    p = _level()
    spans = pack_level(list(p.ops), p.devices)
    assert spans is not None
    lanes = [s for s in spans if s.n == 1 and s.op.id != "a/big"]
    later = [s for s in lanes if s.start > 0]  # run after another on its device
    assert len(lanes) == 6 and later
    # at no time more devices busy than there are
    cuts = sorted({s.start for s in spans})
    for t in cuts:
        assert sum(s.n for s in spans if s.start <= t < s.end) <= p.devices


def test_packing_beats_a_device_each_and_meets_the_continuous_optimum():
    p = _level()
    packed = packed_schedule(p)
    assert packed is not None and schedule_errors(p, packed) == []
    # a device for each small op leaves the large one two devices
    alone = balanced(list(p.ops), p.devices)
    assert alone["a/big"] == 2
    one_each = max(o.layers * o.t(alone[o.id]) for o in p.ops)
    assert packed.compute_s(p) < 0.5 * one_each
    assert packed.compute_s(p) <= 1.001 * level_reference_s(p)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([1, 2, 3, 8, 16, 40]), st.integers(1, 9))
def test_every_packed_schedule_is_valid_and_above_the_bound(seed, N, k):
    p = random_problem(random.Random(seed), N, k)
    s = packed_schedule(p)
    if s is None:  # some level does not pack on these devices: the scheduler skips the start
        return
    assert schedule_errors(p, s) == []
    assert s.compute_s(p) >= lower_bound_s(p) * (1 - 1e-9)
