"""Transfers and gradient sync on hand-made placements."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spindle_dsl.planner.placement import PlacedPiece, Placement
from spindle_dsl.planner.timing import Flows, SharedModule, grad_sync_seconds, time_placement


def transfer(nbytes, src, dst):
    return 0.0 if set(src) == set(dst) else nbytes * 1e-9


def allreduce(nbytes, devices):
    """Superlinear in the group, as when a bigger group crosses slower links."""
    return nbytes * 1e-9 * len(devices) ** 2


FLOWS = Flows(
    carry_bytes={"a/x": 100.0, "b/x": 100.0, "a/y": 50.0},
    backward={"a/x": True, "b/x": False, "a/y": True},
    edges=(("a/x", "a/y", 10.0),),
    shared=(SharedModule("x", 2, 1000.0, (("a/x", 0), ("b/x", 0))),),
)


def seconds(op, n):
    return 1.0 / n


def placement(*waves):
    return Placement(tuple(tuple(w) for w in waves), (0, 0, 0, 0), ())


def test_no_overheads_when_everything_stays_put():
    p = placement(
        [PlacedPiece("a/x", 0, 2, (0, 1))],
        [PlacedPiece("b/x", 0, 2, (0, 1))],
        [PlacedPiece("a/y", 0, 1, (0, 1))],
    )
    t = time_placement(p, seconds, FLOWS, transfer, allreduce)
    assert t.transfer_s == 0 and t.grad_sync_s == 0
    assert t.compute_s == pytest.approx(1.0 + 1.0 + 0.5)


def test_moves_and_split_shared_module_are_charged():
    p = placement(
        [PlacedPiece("a/x", 0, 1, (0, 1)), PlacedPiece("b/x", 0, 2, (2, 3))],
        [PlacedPiece("a/x", 1, 2, (2, 3))],
        [PlacedPiece("a/y", 0, 1, (0,))],
    )
    t = time_placement(p, seconds, FLOWS, transfer, allreduce)
    # wave 1: a/x's carry moves forward and its gradient back; wave 2: the edge a/x -> a/y
    assert t.transfer_s == pytest.approx(2 * 100e-9 + 2 * 10e-9)
    # layer 0 of x: a on {0,1}, b on {2,3}: one all-reduce over {0..3} replaces the two
    # group ones already in the curves; layer 1: both on {2,3}, nothing extra
    assert t.grad_sync_s == pytest.approx(1000e-9 * (16 - 4 - 4))
    assert t.iteration_s == pytest.approx(t.compute_s + t.transfer_s + t.grad_sync_s)


def _per_layer_grad_sync(waves, mod: SharedModule) -> float:
    """The definition, layer by layer (what ``grad_sync_seconds`` computes per run)."""
    groups: dict = {}
    for j in range(mod.layers):
        sets = []
        for op, offset in mod.holders:
            for w in waves:
                for p in w:
                    if p.op == op and p.first <= offset + j < p.end:
                        sets.append(tuple(sorted(p.devices)))
        if len(set(sets)) > 1:
            key = tuple(sorted(sets))
            groups[key] = groups.get(key, 0) + 1
    load: dict[int, float] = {}
    for sets, count in groups.items():
        nbytes = count * mod.bytes_per_layer
        union = tuple(sorted(set().union(*sets)))
        extra = allreduce(nbytes, union) - sum(allreduce(nbytes, s) for s in sets)
        for d in union if extra > 0 else ():
            load[d] = load.get(d, 0.0) + extra
    return max(load.values(), default=0.0)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_gradient_sync_by_runs_equals_the_per_layer_definition(data):
    layers = data.draw(st.integers(1, 9))
    mod = SharedModule("x", layers, 1000.0, (("a/x", 0), ("b/x", 2)))
    waves = []
    for op, offset in mod.holders:
        cuts = sorted(
            data.draw(st.sets(st.integers(1, layers - 1), max_size=3)) if layers > 1 else []
        )
        bounds = [0, *cuts, layers]
        for lo, hi in itertools.pairwise(bounds):
            devs = tuple(sorted(data.draw(st.sets(st.integers(0, 3), min_size=1))))
            waves.append([PlacedPiece(op, offset + lo, offset + hi, devs)])
    flows = Flows({}, {}, (), (mod,))
    got = grad_sync_seconds(placement(*waves), flows, allreduce)
    assert got == pytest.approx(_per_layer_grad_sync(waves, mod), rel=1e-12, abs=1e-15)
