"""The placement ledgers: parts once per device, optimizer state shared by holders."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spindle_dsl.cost.base import GradientLife, PartBytes, SliceMemory
from spindle_dsl.planner.evaluate.ledger import PartLedger, PieceLedger
from spindle_dsl.planner.evaluate.placement import Topology, place
from spindle_dsl.planner.model.problem import OpSpec, Piece, Problem, Schedule

# Two MetaOps "a/m" and "b/m" share module m's two layers (sharded state 1200 B each); each
# piece keeps 10 B of activations per layer and a 7 B working set.
REP, SHARD = 100, 1200


def fake_slice(op: str, n: int, first: int, end: int) -> SliceMemory:
    parts = tuple(PartBytes(f"m/layer.{j}", REP, SHARD) for j in range(first, end))
    return SliceMemory(parts, 10 * (end - first), 7 if op.startswith("a") else 3)


def test_a_part_counts_once_per_device_and_its_state_is_split_over_holders() -> None:
    led = PartLedger(4, fake_slice)
    a, b = Piece("a/m", 0, 2, 3), Piece("b/m", 0, 2, 2)
    led.add(a, [0, 1, 2], led.need(a))
    led.add(b, [2, 3], led.need(b))
    # every layer is held by devices 0-3: each holds 1200 / 4 of its optimizer state
    per_layer = REP + SHARD / 4
    assert led.memory() == (
        int(np.ceil(2 * per_layer + 20 + 7)),
        int(np.ceil(2 * per_layer + 20 + 7)),
        int(np.ceil(2 * per_layer + 40 + 7)),  # both ops' activations, working set max(7, 3)
        int(np.ceil(2 * per_layer + 20 + 3)),
    )
    split = led.breakdown(2)
    assert split.kept == {"a/m": 20, "b/m": 20} and split.working == 7
    assert split.state == int(2 * per_layer)


def test_need_is_cheaper_where_the_parts_already_are() -> None:
    led = PartLedger(3, fake_slice)
    a = Piece("a/m", 0, 2, 1)
    led.add(a, [0], led.need(a))
    need = led.need(Piece("b/m", 0, 2, 1))
    assert need[0] == 20  # activations only; the working set 3 < 7 adds nothing
    assert need[1] == need[2] == 20 + 3 + 2 * (REP + SHARD)


def test_while_placing_the_estimate_never_undercounts() -> None:
    led = PartLedger(4, fake_slice)
    pieces = [(Piece("a/m", 0, 1, 2), [0, 1]), (Piece("b/m", 0, 2, 4), [0, 1, 2, 3])]
    charged = np.zeros(4)
    for p, ds in pieces:
        need = led.need(p)
        charged[ds] += need[ds]
        led.add(p, ds, need)
    assert all(m <= c + 1 for m, c in zip(led.memory(), charged, strict=True))


def test_piece_ledger_adds_each_piece_in_full() -> None:
    led = PieceLedger(2, lambda op, n, layers: 100 * layers)
    p = Piece("a/m", 0, 3, 2)
    led.add(p, [0, 1], led.need(p))
    led.add(Piece("b/m", 0, 1, 1), [1], led.need(Piece("b/m", 0, 1, 1)))
    assert led.memory() == (300, 400)
    assert led.breakdown(1).kept == {"a/m": 300, "b/m": 100}


@pytest.mark.parametrize("capacity", [10_000, 800])
def test_placement_reports_the_exact_memory_and_only_real_overflow(capacity) -> None:
    ops = (
        OpSpec("a/m", 2, (), (1, 2, 3, 4), (4.0, 2.0, 1.5, 1.0)),
        OpSpec("b/m", 2, ("a/m",), (1, 2, 3, 4), (4.0, 2.0, 1.5, 1.0)),
    )
    sched = Schedule("t", ((Piece("a/m", 0, 2, 4),), (Piece("b/m", 0, 2, 4),)))
    led = PartLedger(4, fake_slice)
    placement = place(Problem(ops, 4), sched, Topology(4, 4, capacity, {}), led)
    assert placement.memory == led.memory()
    over = [d for d, m in enumerate(placement.memory) if m > capacity]
    assert [d for d, _, _ in placement.overflow] == over
    assert bool(over) == (capacity < max(placement.memory))
    assert placement.fullest is not None and placement.fullest.kept == {"a/m": 20, "b/m": 20}


# gradients alive through the forwards (k > 1, ZeRO-1), a bucket of 150 B in the backward
CARRIED = GradientLife(carried=True, bucket=150)


def _run_slice(op: str, n: int, first: int, end: int) -> SliceMemory:
    """The same memory as ``fake_slice`` over 12 layers, as one run (how the cost models
    price layers), with a tensor-parallel-like replicated share that depends on n, and
    gradients."""
    k = end - first
    rep = REP // (1 + n % 3)
    run = PartBytes(
        f"m/layers.{first}-{end}",
        rep * k,
        SHARD * k,
        (first, end),
        grads=rep * k,
        grads_sharded=40 * k,
    )
    return SliceMemory((run,), 0, 0, 0, CARRIED)


def _layer_slice(op: str, n: int, first: int, end: int) -> SliceMemory:
    rep = REP // (1 + n % 3)
    parts = tuple(
        PartBytes(f"m/layer.{j}", rep, SHARD, grads=rep, grads_sharded=40)
        for j in range(first, end)
    )
    return SliceMemory(parts, 0, 0, 0, CARRIED)


@pytest.mark.parametrize(
    "life",
    [
        GradientLife(bucket=150),  # one pass, ZeRO-1
        GradientLife(whole_backward=True, bucket=150),  # stage 0
        GradientLife(carried=True, bucket=150),  # k > 1, ZeRO-1
        GradientLife(shards_carried=True, bucket=150),  # k > 1, ZeRO-2
    ],
)
@pytest.mark.parametrize("kept", [0, 10_000])
def test_the_ledger_prices_a_lone_slice_as_the_slice_does(life, kept) -> None:
    """One slice alone on its devices: the ledger's peak is ``SliceMemory.alone``, with the
    gradients where the life says (activations large or none: either moment can be the
    peak); a second MetaOp of the same module adds its activations, not the gradients."""
    parts = (PartBytes("m/layers.0-4", 400, 4800, (0, 4), grads=800, grads_sharded=800),)
    sm = SliceMemory(parts, kept, 30, 5, life)
    led = PartLedger(4, lambda op, n, first, end: sm)
    a = Piece("a/m", 0, 4, 4)
    need = led.need(a)
    led.add(a, range(4), need)
    assert led.memory() == (sm.alone(4),) * 4 == tuple(int(x) for x in need)
    b = Piece("b/m", 0, 4, 4)
    more = led.need(b)
    led.add(b, range(4), more)
    grown = dict(zip(("before", "after"), (sm.alone(4), led.memory()[0]), strict=True))
    assert grown["after"] - grown["before"] == more[0]
    forward = lambda extra: life.peak(extra, 800, 200)  # noqa: E731
    assert more[0] == forward(2 * (kept + 5)) - forward(kept + 5)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 11), st.integers(1, 12), st.sets(st.integers(0, 5), min_size=1)),
        min_size=1,
        max_size=8,
    )
)
def test_runs_split_where_slices_overlap_exactly_as_layers_would(pieces) -> None:
    """Overlapping slices of a shared module, held by several ops on various devices: the
    ledger's rows (runs of layers, split at every boundary) count exactly what per-layer
    parts count, without a row per layer."""
    runs, layers = PartLedger(6, _run_slice), PartLedger(6, _layer_slice)
    for i, (first, length, devices) in enumerate(pieces):
        end = min(12, first + length)
        if end <= first:
            continue
        piece = Piece("ab"[i % 2] + "/m", first, end, len(devices))
        need_runs, need_layers = runs.need(piece), layers.need(piece)
        np.testing.assert_allclose(need_runs, need_layers, rtol=1e-12, atol=1e-6)
        runs.add(piece, sorted(devices), need_runs)
        layers.add(piece, sorted(devices), need_layers)
    assert all(abs(a - b) <= 1 for a, b in zip(runs.memory(), layers.memory(), strict=True)), (
        runs.memory(),
        layers.memory(),
    )
    assert len(runs.length) <= 2 * len(pieces) + 1
