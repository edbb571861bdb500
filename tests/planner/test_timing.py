"""Transfers and gradient sync on hand-made placements."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spindle_dsl.cost.overheads import BUCKET_BYTES, analytic_overheads
from spindle_dsl.cost.step import BackwardClock, PieceTime, make_step_model
from spindle_dsl.language import compile_text
from spindle_dsl.planner.evaluate.build import flows_of
from spindle_dsl.planner.evaluate.placement import PlacedPiece, Placement
from spindle_dsl.planner.evaluate.timing import (
    Flows,
    SharedModule,
    grad_sync_seconds,
    time_placement,
)


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


def _split_x():
    """Shared module x: a on {0,1} in wave 0, b on {2,3} in wave 1, then a/y in wave 2. The
    extra all-reduce of x's 2 layers (2000 bytes) over {0..3}: 2000e-9 * (16 - 4 - 4)."""
    return placement(
        [PlacedPiece("a/x", 0, 2, (0, 1))],
        [PlacedPiece("b/x", 0, 2, (2, 3))],
        [PlacedPiece("a/y", 0, 1, (0, 1))],
    )


EXTRA = 2000e-9 * 8


def test_shared_sync_overlapped_with_the_backward_counts_only_what_outlasts_it():
    p = _split_x()
    assert grad_sync_seconds(p, FLOWS, allreduce) == pytest.approx(EXTRA)
    # x's last backward is wave 0's (the earliest wave holding it): the reduction is ready
    # when wave 0's backward ends; here backward runs 2, 1, 0 and wave 0's ends last.
    last = BackwardClock(ends=(3e-6, 2e-6, 1e-6), total_s=3e-6)
    assert grad_sync_seconds(p, FLOWS, allreduce, last) == pytest.approx(EXTRA)
    # if some backward still follows (say the input stages), that much of it is hidden
    partly = BackwardClock(ends=(3e-6, 2e-6, 1e-6), total_s=3e-6 + EXTRA / 4)
    assert grad_sync_seconds(p, FLOWS, allreduce, partly) == pytest.approx(EXTRA * 3 / 4)
    hidden = BackwardClock(ends=(3e-6, 2e-6, 1e-6), total_s=3e-6 + 2 * EXTRA)
    assert grad_sync_seconds(p, FLOWS, allreduce, hidden) == 0.0
    # the reductions a step makes scale it (ZeRO-2's one per pass)
    assert grad_sync_seconds(p, FLOWS, allreduce, last, scale=2.5) == pytest.approx(2.5 * EXTRA)


def test_overlapped_reductions_on_one_device_queue_in_the_order_they_become_ready():
    # x's layer 0 split in wave 0 (ready late), layer 1 split in wave 2 (ready early): two
    # reductions of 1000 bytes, each 1000e-9 * 8, on the same devices
    p = placement(
        [PlacedPiece("a/x", 0, 1, (0, 1)), PlacedPiece("b/x", 0, 1, (2, 3))],
        [PlacedPiece("a/y", 0, 1, (0, 1))],
        [PlacedPiece("a/x", 1, 2, (0, 1)), PlacedPiece("b/x", 1, 2, (2, 3))],
    )
    one = 1000e-9 * 8
    # backward: wave 2 ends at 0, wave 1 at 10 one-units, wave 0 at 11: the early one is done
    # long before, the late one ends one unit past the end of backward
    clock = BackwardClock(ends=(11 * one, 10 * one, 0.0), total_s=11 * one)
    assert grad_sync_seconds(p, FLOWS, allreduce, clock) == pytest.approx(one)
    # everything ready together at the end: both run after the backward, one after the other
    late = BackwardClock(ends=(11 * one, 11 * one, 11 * one), total_s=11 * one)
    assert grad_sync_seconds(p, FLOWS, allreduce, late) == pytest.approx(2 * one)
    assert grad_sync_seconds(p, FLOWS, allreduce) == pytest.approx(2 * one)


def test_the_backward_clock_runs_the_waves_in_reverse_for_their_backward_share():
    g = compile_text(CLOCK_SPEC).graph
    step = make_step_model(g, analytic_overheads(g.cluster), grad_in_curves=True)
    waves = [[PieceTime(op.id, 0, op.layers, (0, 1), 0.01)] for op in g.metaops]
    price = step.price(waves)
    clock = price.backward_clock()
    shares = [step.ops[w[0].op].backward_share for w in waves]
    bwd = [(d + e) * s for d, e, s in zip(price.durations, price.wave_extra, shares, strict=True)]
    assert 0 < shares[0] < 1
    assert clock.total_s == pytest.approx(sum(bwd))
    for w in range(len(waves)):
        assert clock.ready_s(w) == pytest.approx(sum(bwd[w:]))
    assert clock.ready_s(len(waves)) == 0.0


CLOCK_SPEC = """
cluster { devices = 4; device = "cpu" }
modality text  { tokens = 12; vocab = 64 }
shared  lm     : transformer(layers = 2, hidden = 32, heads = 2, causal = true, vocab = 64)
task a { text -> lm; loss = lm }
task b { text -> lm; loss = lm }
mix default { global_batch = 16; a = 1; b = 1 }
"""


def test_a_step_priced_plan_overlaps_the_shared_sync_when_the_switch_says_so():
    """``time_placement`` with the analytic step model: a shared layer's extra sync runs under
    the backward still to come and only what outlasts it counts; with the overlap switch off
    it is the whole extra, after the backward."""
    g = compile_text(CLOCK_SPEC).graph
    flows = flows_of(g)
    # lm's layer 0 in wave 0 (its backward is the last to run), layer 1 in wave 1 (its
    # backward runs first, then wave 0's: seconds long, enough to hide layer 1's sync)
    p = placement(
        [PlacedPiece("a/lm", 0, 1, (0, 1)), PlacedPiece("b/lm", 0, 1, (2, 3))],
        [PlacedPiece("a/lm", 1, 2, (0, 1)), PlacedPiece("b/lm", 1, 2, (2, 3))],
    )

    def sync_of(overheads):
        step = make_step_model(g, overheads, grad_in_curves=True)
        t = time_placement(p, lambda op, n: 1.0, flows, transfer, allreduce, step)
        return t.grad_sync_s - overheads.all_reduce.seconds(8.0 * 2, g.cluster.devices)

    base = analytic_overheads(g.cluster)
    extra = grad_sync_seconds(p, flows, allreduce)
    assert 0 < extra < 1e-3
    assert sync_of(replace(base, reduction_overlap=False)) == pytest.approx(extra)
    # overlapped: layer 1's half hides under wave 0's backward; layer 0's is ready when its
    # backward is done, before wave 0's input stages' backward, which hides that much of it
    step = make_step_model(g, base, grad_in_curves=True)
    waves = [[PieceTime(q.op, q.first, q.end, q.devices, 1.0) for q in w] for w in p.waves]
    clock = step.price(waves).backward_clock()
    layer0 = clock.start_s(0) + 1.0 * step.ops["a/lm"].backward_share
    assert clock.start_s(0) < layer0 < clock.total_s
    exposed = extra / 2 - (clock.total_s - layer0)
    assert exposed > 0
    assert sync_of(replace(base, reduction_overlap=True)) == pytest.approx(exposed)


def test_a_shared_layer_is_reduced_once_its_holders_finish_it_inside_the_wave():
    """The runtime issues a bucket from its last gradient's accumulation hook: a piece's
    backward finishes its last layer first, so the reductions of a piece's later layers run
    under the backward of its earlier ones, and only the first layer's sticks out."""
    mod = SharedModule("x", 3, BUCKET_BYTES, (("a/x", 0), ("b/x", 0)))  # a bucket per layer
    flows = Flows({}, {}, (), (mod,))
    p = placement([PlacedPiece("a/x", 0, 3, (0, 1)), PlacedPiece("b/x", 0, 3, (2, 3))])
    each = allreduce(BUCKET_BYTES, (0, 1, 2, 3)) - 2 * allreduce(BUCKET_BYTES, (0, 1))
    clock = BackwardClock(ends=(3 * each,), total_s=3 * each)  # a layer's backward: `each`
    # a stage's buckets issued when the stage ends: all three after the backward
    assert grad_sync_seconds(p, flows, allreduce, clock) == pytest.approx(3 * each)
    # layer 2 ready after one layer's backward (reduced by the end of the second), layer 1
    # after two (reduced by the end of the third), layer 0 at the end: one reduction exposed
    got = grad_sync_seconds(p, flows, allreduce, clock, layer_backward=lambda op, n: each)
    assert got == pytest.approx(each)
    # two layers to a bucket: layers 2 and 1 ready together after two layers' backward
    half = SharedModule("x", 3, BUCKET_BYTES / 2, mod.holders)
    got = grad_sync_seconds(
        p, Flows({}, {}, (), (half,)), allreduce, clock, layer_backward=lambda op, n: each
    )
    # the whole extra (3 halves) spread by bytes: 2/3 ready at 2 units, 1/3 at 3 units
    whole = allreduce(1.5 * BUCKET_BYTES, (0, 1, 2, 3)) - 2 * allreduce(1.5 * BUCKET_BYTES, (0, 1))
    assert got == pytest.approx(max(2 * each + whole * 2 / 3, 3 * each) + whole / 3 - 3 * each)


def test_a_move_delays_the_ranks_it_connects_not_the_rest_of_the_wave():
    """With a step model on cores of their own, a wave's moves count where their ranks'
    stages with them outlast the wave's slowest group; with no group to hide behind, all of
    them count, as when priced after the wave."""
    g = compile_text(CLOCK_SPEC).graph
    flows = flows_of(g)
    step = make_step_model(g, analytic_overheads(g.cluster), grad_in_curves=True)

    def moved(nbytes, src, dst):
        return 0.0 if set(src) == set(dst) else 0.5

    def timed(b_layer_s):
        p = placement(
            [PlacedPiece("a/lm", 0, 1, (0, 1)), PlacedPiece("b/lm", 0, 1, (2, 3))],
            [PlacedPiece("a/lm", 1, 2, (0,)), PlacedPiece("b/lm", 1, 2, (2, 3))],
        )
        seconds = lambda op, n: b_layer_s if op == "b/lm" else 1.0  # noqa: E731
        return time_placement(p, seconds, flows, moved, allreduce, step)

    hidden = timed(3.0)  # a's ranks: 1 s of layers + 0.5 s forward + 0.5 s back < 3 s
    assert hidden.wave_transfer[1] == 0.0 and hidden.transfer_s == 0.0
    exposed = timed(1.0)  # nothing longer beside them: the whole second shows
    assert exposed.wave_transfer[1] == pytest.approx(1.0, abs=1e-3)
    assert exposed.iteration_s == pytest.approx(
        exposed.compute_s
        + exposed.transfer_s
        + exposed.grad_sync_s
        + exposed.wave_overhead_s
        + exposed.loss_s
        + exposed.optimizer_s
    )


def test_exposed_moves_are_the_per_device_stages_past_the_longest_group():
    """On random two-wave placements, each wave's exposed moves equal the definition: every
    device's stage (its piece with its extra, plus its own moves both ways; a device with
    moves and no piece, the moves alone: the second wave may leave devices idle) past the wave's
    longest piece, capped at the moves priced after the wave."""
    import random

    g = compile_text(CLOCK_SPEC).graph
    flows = flows_of(g)
    step = make_step_model(g, analytic_overheads(g.cluster), grad_in_curves=True)
    rng = random.Random(7)

    def moved(nbytes, src, dst):
        return 0.0 if set(src) == set(dst) else 0.1 + 0.01 * len(src) + 0.02 * len(dst)

    for _ in range(60):
        devs = list(range(g.cluster.devices))
        rng.shuffle(devs)
        cut, cut2 = rng.randint(1, 3), rng.randint(1, 3)
        first = [
            PlacedPiece("a/lm", 0, 1, tuple(devs[:cut])),
            PlacedPiece("b/lm", 0, 1, tuple(devs[cut:])),
        ]
        rng.shuffle(devs)
        second = [
            PlacedPiece("a/lm", 1, 2, tuple(devs[:cut2])),
            PlacedPiece("b/lm", 1, 2, tuple(devs[cut2 : rng.randint(cut2 + 1, 4)])),
        ]
        slow = {"a/lm": rng.uniform(0.1, 2.0), "b/lm": rng.uniform(0.1, 2.0)}
        t = time_placement(
            placement(first, second),
            lambda op, n, slow=slow: slow[op] / n,
            flows,
            moved,
            allreduce,
            step,
        )
        load: dict[int, float] = {}
        busiest = {"f": {}, "b": {}}
        for q, p in zip(first, second, strict=True):
            if set(q.devices) == set(p.devices):
                continue
            for way, secs in (
                ("f", moved(0, q.devices, p.devices)),
                ("b", moved(0, p.devices, q.devices)),
            ):
                for d in set(q.devices) | set(p.devices):
                    load[d] = load.get(d, 0.0) + secs
                    busiest[way][d] = busiest[way].get(d, 0.0) + secs
        after = sum(max(w.values(), default=0.0) for w in busiest.values())
        stages = {d: load.get(d, 0.0) for d in load}
        longest = 0.0
        for p, extra in zip(second, t.entry_extra[1], strict=True):
            secs = (p.end - p.first) * slow[p.op] / len(p.devices) + extra
            longest = max(longest, secs)
            for d in p.devices:
                stages[d] = secs + load.get(d, 0.0)
        want = min(max(max(stages.values(), default=0.0) - longest, 0.0), after)
        assert t.wave_transfer[1] == pytest.approx(want, abs=1e-12)
