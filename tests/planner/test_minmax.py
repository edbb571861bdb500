"""Min-max allocations by bisection (``planner.starts.layout``) against the greedy way they
replace."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from synth import random_problem

from spindle_dsl.planner.model.problem import OpSpec
from spindle_dsl.planner.starts.layout import min_max


def _greedy(ops: list[OpSpec], devices: int, layers: dict[str, int]) -> dict[str, int] | None:
    """The reference: every op on its least allocation, the slowest taking its next faster one
    while it fits (what ``balanced`` and ``rebalance`` did before)."""
    alloc = {o.id: o.pareto[0] for o in ops}
    by_id = {o.id: o for o in ops}
    free = devices - sum(alloc.values())
    if free < 0:
        return None
    while True:
        slow = max(alloc, key=lambda i: layers[i] * by_id[i].t(alloc[i]))
        nxt = by_id[slow].next_faster(alloc[slow], alloc[slow] + free)
        if nxt is None:
            return alloc
        free -= nxt - alloc[slow]
        alloc[slow] = nxt


def _longest(ops: list[OpSpec], alloc: dict[str, int], layers: dict[str, int]) -> float:
    return max(layers[o.id] * o.t(alloc[o.id]) for o in ops)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([1, 2, 3, 8, 16, 40, 128]), st.integers(1, 9))
def test_the_longest_piece_is_as_short_as_the_greedy_ones(seed, N, k):
    rng = random.Random(seed)
    p = random_problem(rng, N, k)
    ops = rng.sample(list(p.ops), min(len(p.ops), rng.randint(1, 6)))
    layers = {o.id: rng.randint(1, o.layers) for o in ops}
    got, want = min_max(ops, N, layers), _greedy(ops, N, layers)
    assert (got is None) == (want is None)
    if got is None or want is None:
        return
    assert sum(got.values()) <= N
    assert all(o.valid(got[o.id]) for o in ops)
    assert _longest(ops, got, layers) <= _longest(ops, want, layers) * (1 + 1e-12)


def test_ops_that_do_not_fit_side_by_side_get_none():
    ns = (2, 4)
    ops = [OpSpec(f"{t}/m", 4, (), ns, (1.0, 0.5), task=t) for t in "abc"]
    assert min_max(ops, 5) is None
    assert min_max(ops, 6) == {"a/m": 2, "b/m": 2, "c/m": 2}
