"""The step model: core sharing, the runtime-style gradient reduction and its overlap switch,
micro-batches, and a plan whose breakdown adds up to its iteration time."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from spindle_dsl.cluster import CORES_ENV, usable_cores
from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.jitter import expected_latest
from spindle_dsl.cost.overheads import (
    Collective,
    Line,
    StepOverheads,
    analytic_overheads,
    part_class,
)
from spindle_dsl.cost.step import PieceTime, backward_clock, make_step_model, shared_makespan
from spindle_dsl.cost.step_parts import op_steps
from spindle_dsl.language import compile_text
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner import make_plan

SPEC = """
cluster { devices = 4; device = "cpu" }
modality image { tokens = 16 }
modality text  { tokens = 12; vocab = 64 }
encoder vision : vit(layers = 2, hidden = 32, heads = 2, patch = 4) <- image
shared  lm     : transformer(layers = 2, hidden = 32, heads = 2, causal = true, vocab = 64)
module  proj   : mlp(in = 32, out = 32)
task caption { image -> vision -> proj -> lm; text -> lm; loss = lm }
task chat    { text -> lm; loss = lm }
mix default { global_batch = 16; caption = 1; chat = 1 }
"""


def graph(cores: int | None = None):
    g = compile_text(SPEC).graph
    return replace(g, cluster=replace(g.cluster, cores=cores)) if cores else g


def overheads(**changes) -> StepOverheads:
    """Round figures: a collective costs 1 ms + 1 ns per byte; everything else nothing."""
    line = Line(1e-3, 1e-9)
    base = StepOverheads(
        source="test",
        all_reduce=Collective(((2, line),)),
        reduce_scatter=Collective(((2, line),)),
        all_gather=Collective(((2, line),)),
        p2p=Line(0.0, 0.0),
        optimizer=Line(0.0, 0.0),
        copy_s_per_byte=0.0,
        wave_s=0.0,
        seconds_per_flop=0.0,
    )
    return replace(base, **changes)


def test_shared_makespan_is_processor_sharing() -> None:
    assert shared_makespan([3.0, 1.0, 1.0], None) == 3.0
    assert shared_makespan([3.0, 1.0], 2) == 3.0  # no more jobs than cores
    assert shared_makespan([1.0, 1.0, 1.0, 1.0], 2) == pytest.approx(2.0)
    # 3 jobs on 2 cores: all at 2/3 speed until the short ones end at 1.5, then the long one
    # alone: 2 seconds of work left at full speed.
    assert shared_makespan([3.0, 1.0, 1.0], 2) == pytest.approx(3.5)
    # taking turns measured 1.5x slower than the fair share: only while jobs outnumber cores
    assert shared_makespan([1.0, 1.0, 1.0, 1.0], 2, 1.5) == pytest.approx(3.0)
    assert shared_makespan([3.0, 1.0, 1.0], 2, 2.0) == pytest.approx(3.0 + 2.0)
    assert shared_makespan([3.0, 1.0], 2, 2.0) == 3.0


def test_the_measured_sharing_slowdown_prices_crowded_waves_and_round_trips() -> None:
    g = graph(cores=2)
    plain = make_step_model(g, overheads(), grad_in_curves=False)
    slow = make_step_model(g, overheads(sharing_slowdown=1.5), grad_in_curves=False)
    crowded = _pieces(g, lambda op: (0, 1, 2, 3))  # 4 devices on 2 cores
    assert slow.price(crowded).durations == pytest.approx(
        [1.5 * d for d in plain.price(crowded).durations]
    )
    roomy = _pieces(g, lambda op: (0, 1))  # 2 devices on 2 cores: no turns to take
    assert slow.price(roomy).durations == plain.price(roomy).durations
    again = StepOverheads.from_dict(overheads(sharing_slowdown=1.5).to_dict(), "x")
    assert again.sharing_slowdown == 1.5
    assert shared_makespan([0.0, 2.0], 1) == 2.0  # idle devices cost nothing


def test_collective_scales_like_a_ring_from_the_nearest_measured_size() -> None:
    c = Collective(((2, Line(1e-3, 1e-9)), (4, Line(3e-3, 1.5e-9))))
    assert c.seconds(1e6, 2) == pytest.approx(1e-3 + 1e-3)
    assert c.seconds(1e6, 4) == pytest.approx(3e-3 + 1.5e-3)
    # 8 ranks from the 4-rank fit: 7/3 of the latency, (7/8)/(3/4) of the volume term.
    assert c.seconds(1e6, 8) == pytest.approx(3e-3 * 7 / 3 + 1.5e-3 * (7 / 8) / (3 / 4))
    assert c.seconds(1e6, 1) == 0.0 and c.seconds(0, 4) == 0.0


def test_overheads_round_trip_through_json() -> None:
    o = replace(
        analytic_overheads(graph().cluster),
        inputs=(("k", Line(1.0, 2.0)),),
        losses=(("l", Line(3.0, 4.0)),),
        parts=(("lm/layer", 5e-4), ("vision/layer", 3e-4)),
        parts_alone=(("lm/layer", 2e-4),),
        cores=2,
    )
    back = StepOverheads.from_dict(o.to_dict(), o.source)
    assert back == o and back.input_line("k") == Line(1.0, 2.0)
    assert back.part_seconds("lm/layer.3", 100.0) == 5e-4  # every layer of lm alike
    assert back.part_seconds("lm/head", 100.0) == o.part_s + o.copy_s_per_byte * 100.0
    # an only holder: its own measured figure; else what a profile measured for several
    # holders (older profiles); else the fixed part without the copies
    assert back.part_alone_seconds("lm/layer.0", 100.0) == 2e-4
    assert back.part_alone_seconds("vision/layer.1", 100.0) == 3e-4
    assert back.part_alone_seconds("lm/head", 100.0) == o.part_s
    assert back.part_least_seconds("lm/layer.2", 100.0) == 2e-4


def test_an_only_holder_steps_its_parts_in_place_and_several_through_flat_buffers() -> None:
    g = graph()
    a = g.metaops[0]
    o = replace(overheads(), optimizer=Line(0.0, 0.0), part_s=1e-3, copy_s_per_byte=0.0)
    o = replace(
        o, parts_alone=tuple((part_class(k), 4e-3) for k, _ in op_steps(g)[a.id].layer_parts)
    )
    step = make_step_model(g, o, grad_in_curves=False)
    layers = sum(1 for _, b in op_steps(g)[a.id].layer_parts if b > 0)
    alone = step.price([[PieceTime(a.id, 0, a.layers, (0,), 0.01)]]).optimizer_s
    shared = step.price([[PieceTime(a.id, 0, a.layers, (0, 1), 0.01)]]).optimizer_s
    assert layers > 0
    assert alone == pytest.approx(layers * 4e-3 + _other_parts(step, a.id) * 1e-3)
    assert shared == pytest.approx(layers * 1e-3 + _other_parts(step, a.id) * 1e-3)


def _other_parts(step, op_id: str) -> int:
    """Trainable parts of ``op_id`` besides its layers (input stages, an LM head) on its
    first device: their per-part work is ``part_s`` either way here."""
    op = step.ops[op_id]
    heads = sum(1 for s in step.sinks if s.sink == op_id and s.head_part and s.head_bytes)
    return sum(1 for s in op.inputs if s.grad_bytes) + heads


def test_cores_default_to_the_machine_and_the_cluster_can_say(monkeypatch) -> None:
    monkeypatch.setenv(CORES_ENV, "3")
    assert usable_cores() == 3
    g = graph()
    assert g.cluster.shared_cores == 3  # 4 cpu devices on 3 cores share them
    assert replace(g.cluster, cores=8).shared_cores is None  # enough cores: no sharing
    monkeypatch.delenv(CORES_ENV)
    assert usable_cores() >= 1


def test_cores_flag_overrides_the_machine(tmp_path, capsys) -> None:
    from spindle_dsl.cli import main

    spec = tmp_path / "s.spindle"
    spec.write_text(SPEC)
    out = {}
    for cores in ("1", "4"):
        plan = tmp_path / f"plan-{cores}.json"
        assert main(["plan", str(spec), "--cores", cores, "--out", str(plan), "--quiet"]) == 0
        out[cores] = json.loads(plan.read_text())
    assert out["1"]["step_model"]["cores"] == 1 and out["4"]["step_model"]["cores"] is None
    assert out["1"]["breakdown"]["compute_s"] > out["4"]["breakdown"]["compute_s"]
    assert main(["plan", str(spec), "--cores", "0"]) == 1
    assert "--cores must be a whole number of at least 1" in capsys.readouterr().err


def _pieces(g, devices_of) -> list[list[PieceTime]]:
    """A sequential schedule: every MetaOp in turn, each of its layers 10 ms."""
    return [[PieceTime(op.id, 0, op.layers, devices_of(op), 0.01 * op.layers)] for op in g.metaops]


def test_devices_sharing_cores_slow_the_waves_down() -> None:
    g = graph(cores=2)
    step = make_step_model(g, overheads(), grad_in_curves=False)
    on_all = step.price(_pieces(g, lambda op: (0, 1, 2, 3)))
    on_two = step.price(_pieces(g, lambda op: (0, 1)))
    assert on_all.durations == pytest.approx([2 * d for d in on_two.durations])
    assert step.cores == 2
    roomy = make_step_model(graph(cores=4), overheads(), grad_in_curves=False)
    assert roomy.cores is None
    assert roomy.price(_pieces(g, lambda op: (0, 1, 2, 3))).durations == on_two.durations


def test_reduction_is_priced_per_holder_set_and_the_overlap_switch_hides_some() -> None:
    g = graph(cores=8)
    waves = _pieces(g, lambda op: (0, 1))
    plain = make_step_model(g, overheads(), grad_in_curves=False).price(waves)
    # Every trainable part is held by devices 0 and 1: one bucket, a reduce-scatter and an
    # all-gather of all the gradient bytes.
    total = sum(
        b
        for op in make_step_model(g, overheads(), grad_in_curves=False).ops.values()
        for _, b in (*op.layer_parts, *((s.part, s.grad_bytes) for s in op.inputs))
    )
    assert total > 0
    assert plain.grad_sync_s > 2e-3  # two collectives of >= 1 ms each
    # Overlapped, buckets of one layer's size: those of later waves reduce under the backward
    # of earlier ones, and the all-gather after the update is never hidden.
    small = overheads(reduction_overlap=True, bucket_bytes=total / 8)
    hidden = make_step_model(g, small, grad_in_curves=False).price(waves).grad_sync_s
    unhidden = make_step_model(g, replace(small, reduction_overlap=False), grad_in_curves=False)
    assert 0 < hidden < unhidden.price(waves).grad_sync_s
    one_bucket = make_step_model(g, overheads(reduction_overlap=True), grad_in_curves=False)
    assert one_bucket.price(waves).grad_sync_s == pytest.approx(plain.grad_sync_s)
    # the curves' own all-reduce (analytic model): the step adds nothing here
    assert make_step_model(g, overheads(), grad_in_curves=True).price(waves).grad_sync_s == 0
    # one device: nothing to reduce
    alone = make_step_model(g, overheads(), grad_in_curves=False).price(_pieces(g, lambda o: (0,)))
    assert alone.grad_sync_s == 0


def test_reductions_overlap_the_backward_only_where_a_core_is_spare() -> None:
    """gloo's collectives run on CPU threads: with every core computing they wait for the
    backward to end, so the model prices them after it."""
    probe = make_step_model(graph(cores=8), overheads(), grad_in_curves=False)
    total = sum(b for op in probe.ops.values() for _, b in op.layer_parts)
    small = overheads(reduction_overlap=True, bucket_bytes=total / 8, min_bucket_bytes=0.0)
    spare = make_step_model(graph(cores=8), small, grad_in_curves=False)
    busy = make_step_model(graph(cores=4), small, grad_in_curves=False)  # 4 devices, 4 cores
    assert spare.overlaps_reduction and not busy.overlaps_reduction
    waves = _pieces(graph(), lambda op: (0, 1))
    assert spare.price(waves).grad_sync_s < busy.price(waves).grad_sync_s
    unhidden = make_step_model(graph(cores=8), replace(small, reduction_overlap=False),
                               grad_in_curves=False)  # fmt: skip
    assert busy.price(waves).grad_sync_s == pytest.approx(unhidden.price(waves).grad_sync_s)
    gpu = compile_text(SPEC.replace('device = "cpu"', 'device = "a100-80gb"')).graph
    assert make_step_model(gpu, small, grad_in_curves=False).overlaps_reduction


def test_micro_batches_repeat_the_passes_and_zero2_the_reduce_scatter() -> None:
    g = graph(cores=8)
    o = overheads(wave_s=1e-3, optimizer=Line(1e-3, 0.0), seconds_per_flop=1e-12)
    step = make_step_model(g, o, grad_in_curves=False)
    waves = _pieces(g, lambda op: (0, 1))
    one = step.price(waves, micro_batches=1)
    four = step.price(waves, micro_batches=4)
    assert one.optimizer_s == four.optimizer_s  # one optimizer step per iteration
    # reduced once (ZeRO-1), not 4 times: the same up to when the buckets are ready (the last
    # pass's input stages, on a quarter of the batch, are shorter)
    assert four.grad_sync_s == pytest.approx(one.grad_sync_s, rel=1e-3)
    zero2 = step.price(waves, micro_batches=4, zero_stage=2)
    assert zero2.grad_sync_s > four.grad_sync_s  # a reduce-scatter in every pass
    assert four.loss_s < one.loss_s  # each pass's loss runs on a quarter of the batch


def test_a_plan_breakdown_adds_up_and_the_plan_is_valid() -> None:
    g = graph(cores=2)
    plan = make_plan(g, make_cost_model(g.cluster), time_limit_s=0.3)
    parts = dict(plan.breakdown)
    assert set(parts) >= {"compute_s", "wave_overhead_s", "loss_s", "optimizer_s"}
    assert sum(parts.values()) == pytest.approx(plan.iteration_s)
    assert validate_plan(plan) == []
    record = plan.extra["step_model"]
    # 4 devices time-sliced over 2 cores: no core left for the collectives to run beside them
    assert record["cores"] == 2 and record["reduction_overlap"] is False
    assert len(record["wave_extra_s"]) == len(plan.waves)


def test_a_tied_heads_embedding_is_reduced_over_the_head_devices_too() -> None:
    """The runtime holds a tied head's embedding stage with the head, so the stage's
    gradient is reduced over the input's devices and the head's together."""
    tied = SPEC.replace("vocab = 64)", "vocab = 64, tie_embeddings = true)")
    g = compile_text(tied).graph
    step = make_step_model(g, overheads(), grad_in_curves=False)
    chat = next(s for s in step.sinks if s.task == "chat")
    assert chat.tied_part == "lm/input.text" and chat.tied_bytes > 0
    # chat's lm: layer 0 on device 0, layer 1 (and so the head) on device 1
    waves = [[PieceTime("chat/lm", 0, 1, (0,), 0.01)], [PieceTime("chat/lm", 1, 2, (1,), 0.01)]]
    held = step._holders(waves)
    assert held["lm/input.text"].devices == {0, 1}
    untied = make_step_model(graph(), overheads(), grad_in_curves=False)
    assert untied._holders(waves)["lm/input.text"].devices == {0}
    assert step.price(waves).grad_sync_s > untied.price(waves).grad_sync_s


def test_the_one_core_each_fast_path_prices_as_the_per_device_sum() -> None:
    """With a core per device a wave's duration is its slowest piece; priced per device over
    a node's cores instead (cores one fewer than devices, no node running more pieces than
    cores), the same waves cost the same, term by term."""
    g = graph()
    step = make_step_model(g, overheads(wave_s=1e-4), grad_in_curves=False)
    assert step.core_each
    sliced = replace(step, cores=step.devices_per_node - 1)
    assert not sliced.core_each
    ops = [op for op in g.metaops if op.batch > 0]
    waves = [
        [
            PieceTime(ops[i].id, 0, ops[i].layers, (0,), 0.01 * (i + 1)),
            PieceTime(ops[i + 1].id, 0, ops[i + 1].layers, (1, 2), 0.003 * (i + 1)),
        ]
        for i in range(len(ops) - 1)
    ]
    assert step.price(waves) == sliced.price(waves)
    overlapping = [
        [PieceTime(ops[0].id, 0, 1, (0, 1), 0.01), PieceTime(ops[1].id, 0, 1, (1,), 0.02)]
    ]
    assert step.price(overlapping).durations == pytest.approx((0.03,))  # device 1 runs both


def test_rank_jitter_prices_the_wait_for_a_waves_latest_rank_and_round_trips() -> None:
    g = graph()
    plain = make_step_model(g, overheads(), grad_in_curves=False)
    noisy = make_step_model(g, overheads(rank_jitter=0.2), grad_in_curves=False)
    a, b = g.metaops[0], g.metaops[1]

    def late(waves) -> float:
        calm, waiting = plain.price(waves), noisy.price(waves)
        assert calm.durations == waiting.durations  # the layers are what they are ...
        return waiting.wave_extra[0] - calm.wave_extra[0]  # ... the wait comes on top

    # one group on two ranks (they meet at their gradient buckets): the latest of two 10 ms
    # stages straying by 20% ends 2 ms / sqrt(pi) late
    pair = [[PieceTime(a.id, 1, 2, (0, 1), 0.01)]]  # a later layer: no input stage
    assert late(pair) == pytest.approx(
        expected_latest([0.01 + noisy.overheads.wave_s], 0.2, [2]) - 0.01 - noisy.overheads.wave_s
    )
    assert late(pair) == pytest.approx(0.2 * (0.01 + noisy.overheads.wave_s) / math.sqrt(math.pi))
    # two groups of two side by side: the latest of their four ranks
    side_by_side = [[PieceTime(a.id, 0, 1, (0, 1), 0.01), PieceTime(b.id, 0, 1, (2, 3), 0.01)]]
    stages = [0.01 + e for e in plain.price(side_by_side).entry_extra[0]]
    assert late(side_by_side) == pytest.approx(expected_latest(stages, 0.2, [2, 2]) - max(stages))
    assert late(side_by_side) > late(pair)
    alone = [[PieceTime(a.id, 1, 2, (0,), 0.01)]]  # a rank alone waits for no one
    assert noisy.price(alone) == plain.price(alone)
    again = StepOverheads.from_dict(overheads(rank_jitter=0.2).to_dict(), "x")
    assert again.rank_jitter == 0.2


def test_a_bucket_is_ready_when_its_last_layer_is_done_inside_the_wave() -> None:
    """The runtime issues a bucket from its last gradient's hook, and a piece's backward
    finishes its last layer first: layer g of a piece [first, end) is done (end - g) layers
    into the wave's backward, its input stages after its first layer."""
    g = graph(cores=8)
    step = make_step_model(
        g, overheads(bucket_bytes=1.0, min_bucket_bytes=0.0), grad_in_curves=False
    )  # a bucket per part
    op = step.ops["chat/lm"]
    held = step._holders([[PieceTime("chat/lm", 0, 2, (0, 1), 2.0)]])
    each = 1.0 * op.backward_share  # one layer's backward
    (k0, _), (k1, _) = op.layer_parts
    assert held[k1].lag_s == pytest.approx(each) and held[k0].lag_s == pytest.approx(2 * each)
    assert all(held[s.part].lag_s == pytest.approx(2 * each) for s in op.inputs)
    # the LM head's gradient is final after the loss, before any wave's backward: its bucket
    # comes first, ready at once; then later layers first
    buckets = [(wave, lag) for _, _, wave, lag in step._buckets(held)]
    head = next(s for s in step.sinks if s.sink == "chat/lm")
    assert held[head.head_part].wave == 1 and buckets[0] == (1, 0.0)
    assert buckets[1] == (0, pytest.approx(each))
    clock = backward_clock([2.0 * step.ops["chat/lm"].backward_share])
    assert clock.start_s(0) == 0.0 and clock.ready_s(0) == pytest.approx(2 * each)


def test_zero0_steps_every_part_in_place_on_each_holder() -> None:
    """ZeRO-0: each holder updates whole parts (every byte), having laid the gradients into
    the all-reduced flat buffer (one copy), and copies nothing back; ZeRO-1: its shard of the
    bytes, the gradients into the rows and the weights back out (two copies)."""
    g = graph(cores=8)
    o = overheads(optimizer=Line(0.0, 1e-9), copy_s_per_byte=1e-9, part_s=1e-3)
    step = make_step_model(g, o, grad_in_curves=False)
    held = step._holders(_pieces(g, lambda op: (0, 1)))  # every part on both ranks
    total, parts = sum(h.nbytes for h in held.values()), len(held)
    assert all(len(h.devices) == 2 for h in held.values())
    assert step._optimizer(held, 0) == pytest.approx(1e-9 * total * 1.5 + parts * 1e-3)
    assert step._optimizer(held, 1) == pytest.approx(1e-9 * total * 1.5 + parts * 1e-3)
    bigger = replace(o, copy_s_per_byte=4e-9)  # copies dearer: ZeRO-0 makes half as many
    step = make_step_model(g, bigger, grad_in_curves=False)
    assert step._optimizer(held, 0) == pytest.approx(1e-9 * total * 3 + parts * 1e-3)
    assert step._optimizer(held, 1) == pytest.approx(1e-9 * total * 4.5 + parts * 1e-3)


FROZEN = """
cluster { devices = 2; device = "cpu" }
modality image { tokens = 16 }
modality text  { tokens = 12; vocab = 64 }
encoder vision : vit(layers = 2, hidden = 32, heads = 2, patch = 4) <- image frozen
shared  lm     : transformer(layers = 2, hidden = 32, heads = 2, causal = true, vocab = 64)
task caption { image -> vision -> lm; text -> lm; loss = lm }
task chat    { text -> lm; loss = lm }
mix default { global_batch = 16; caption = 1; chat = 1 }
"""


def test_a_wave_lasts_its_slowest_forward_plus_its_slowest_backward() -> None:
    """A pass runs every wave's forward, then the backwards: a frozen tower (all forward)
    beside an LM piece (a third forward, two thirds backward) makes each rank wait in one
    phase, so the wave takes the tower's forward plus the LM's backward; pieces that split
    their time alike take their slowest whole, as before; the backward clock runs on the
    backward phases."""
    g = compile_text(FROZEN).graph

    def on_cores(cores: int):
        return make_step_model(
            replace(g, cluster=replace(g.cluster, cores=cores)), overheads(), grad_in_curves=False
        )

    step = on_cores(2)
    assert step.ops["caption/vision"].backward_share == 0.0
    assert step.ops["chat/lm"].backward_share == pytest.approx(2 / 3)
    mixed = [[PieceTime("caption/vision", 0, 2, (0,), 3.0), PieceTime("chat/lm", 0, 2, (1,), 3.0)]]
    price = step.price(mixed)
    assert price.durations == pytest.approx([3.0 + 2.0])  # not max(3, 3)
    assert price.backward_s == pytest.approx([2.0])
    assert price.backward_clock().total_s == pytest.approx(2.0)
    alike = [[PieceTime("caption/lm", 0, 2, (0,), 3.0), PieceTime("chat/lm", 0, 2, (1,), 2.0)]]
    assert step.price(alike).durations == pytest.approx([3.0])
    # two ranks on one core: each phase shared on its own (all the work, in turn)
    assert on_cores(1).price(mixed).durations == pytest.approx([(3.0 + 1.0) + (0.0 + 2.0)])


def test_where_devices_share_cores_the_buckets_fill_to_the_cap() -> None:
    """As the runtime cuts them (``shards.least_bucket_elements``): with cores to spare a
    bucket closes at its wave, on shared cores only at the cap."""
    probe = make_step_model(graph(cores=8), overheads(), grad_in_curves=False)
    total = sum(b for op in probe.ops.values() for _, b in op.layer_parts)
    roomy = overheads(bucket_bytes=2 * total, min_bucket_bytes=0.0)
    waves = _pieces(graph(), lambda op: (0, 1))

    def buckets(cores: int) -> list:
        step = make_step_model(graph(cores=cores), roomy, grad_in_curves=False)
        return step._buckets(step._holders(waves))

    assert len(buckets(8)) > 1
    assert len(buckets(2)) == 1
