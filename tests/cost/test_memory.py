"""The memory model: distributed optimizer, parts, input stages and heads, recompute."""

from __future__ import annotations

import numpy as np
import pytest

from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.analytic import AnalyticCostModel, backward_multiplier, price
from spindle_dsl.cost.base import has_slice_memory
from spindle_dsl.cost.fit import PiecewiseFit, Segment
from spindle_dsl.cost.memory import (
    GRAD_BUCKET_ELEMENTS,
    grad_bytes,
    gradient_life,
    op_memory_info,
    slice_activations,
    state_split,
)
from spindle_dsl.cost.memory_table import alone_bytes
from spindle_dsl.cost.profile import Profile, ProfiledCostModel, ProfileEntry, Sample, shape_key
from spindle_dsl.kinds import get_kind
from spindle_dsl.language import compile_text


def linear_profile(graph, alpha: float, beta: float) -> Profile:
    """A profile measuring every shape of ``graph`` as alpha + beta * FLOPs."""
    entries = {}
    for op in graph.metaops:
        kind, args, tokens, mode, _ = shape_key(op)
        entries[shape_key(op)] = ProfileEntry(
            kind,
            args,
            tokens,
            mode,  # type: ignore[arg-type]
            (op.id,),
            (Sample(1, 1.0, alpha + beta),),
            PiecewiseFit((Segment(0.0, float("inf"), alpha, beta),)),
        )
    return Profile("cuda", "x", "x", 1, "bfloat16", "s", tuple(entries.values()))


@pytest.fixture(scope="module")
def graph(memory_spec):
    return compile_text(memory_spec(48)).graph


@pytest.fixture(scope="module")
def model(graph):
    return make_cost_model(graph.cluster)


def test_precision_splits_follow_the_distributed_optimizer(cluster) -> None:
    gpu, cpu = cluster(8), cluster(1, "cpu")
    assert state_split(gpu, True) == (2, 12)  # bf16 weights | fp32 master, Adam m, v
    assert state_split(gpu, False) == (2, 0)
    assert state_split(cpu, True) == (4, 8)  # fp32 weights | Adam m, v
    assert state_split(cpu, False) == (4, 0)
    # gradients are apart: alive only where the runtime keeps them (GradientLife)
    assert (grad_bytes(gpu, True), grad_bytes(cpu, True), grad_bytes(gpu, False)) == (2, 4, 0)


def test_layer_parts_replicate_weights_and_shard_the_optimizer(graph, model) -> None:
    op = graph.op("caption/lm")
    cfg = model.config(op, 4)
    sm = model.slice_memory(graph, op, 4, 2, 4)
    # one run for layers 2 and 3 (nothing counts layers one by one), priced per layer
    (run,) = sm.parts
    assert run.key == "lm/layers.2-4" and run.layers == (2, 4) and run.count == 2
    weights = int(op.params_per_layer * 2 / cfg.tp)
    assert run.replicated == 2 * weights
    assert run.sharded == 2 * op.params_per_layer * 12
    assert run.grads == 2 * weights and run.grads_sharded == 2 * op.params_per_layer * 2
    shard = -(-(op.params_per_layer * 12) // 4)  # each layer's optimizer state sharded
    assert run.on(4) == 2 * (weights + shard)
    # one pass under ZeRO-1: no gradient is alive at the end of the forward, where these
    # kept activations make the peak (the backward holds a bucket and the shards at most)
    assert sm.kept > run.grads + run.grad_share(4)
    assert sm.alone(4) == 2 * (weights + shard) + sm.kept + sm.working


def test_frozen_parts_keep_only_their_weights(graph, model) -> None:
    op = graph.op("caption/vision")
    sm = model.slice_memory(graph, op, 1, 0, 1)
    layer, stage = sm.parts
    assert layer.key == "vision/layers.0-1" and stage.key == "vision/input.image"
    assert layer == type(layer)(layer.key, op.params_per_layer * 2, 0, (0, 1))
    assert stage.sharded == 0


def test_input_stages_ride_with_the_first_layer_and_the_head_with_the_last(graph, model) -> None:
    op = graph.op("caption/lm")
    keys = {
        (a, b): [p.key for p in model.slice_memory(graph, op, 2, a, b).parts]
        for a, b in [(0, 1), (3, 4), (5, 6), (0, 6)]
    }
    assert keys[(0, 1)] == ["lm/layers.0-1", "lm/input.text"]
    assert keys[(3, 4)] == ["lm/layers.3-4"]
    assert keys[(5, 6)] == ["lm/layers.5-6", "lm/head"]
    assert keys[(0, 6)][0] == "lm/layers.0-6"
    assert keys[(0, 6)][-2:] == ["lm/input.text", "lm/head"]
    info = op_memory_info(graph, op)
    kind, args = get_kind("transformer"), dict(graph.module("lm").args)
    assert info.head is not None and info.head.sharded == kind.head_params(args) * 12
    stage = graph.stage_modality("lm", "text")
    assert info.inputs[0].sharded == kind.input_stage_params(args, stage) * 12


def test_every_parameter_of_a_module_is_in_exactly_one_part(graph, model) -> None:
    """The parts of all MetaOps, deduplicated by key, add up to each module's parameters."""
    per_param: dict[str, int] = {}
    for op in graph.metaops:
        for p in model.slice_memory(graph, op, 1, 0, op.layers).parts:
            module = p.key.split("/")[0]
            trainable = not graph.module(module).frozen
            bytes_per_param = sum(state_split(graph.cluster, trainable))
            per_param[p.key] = (p.replicated + p.sharded) // bytes_per_param
    for module in graph.modules:
        held = sum(v for k, v in per_param.items() if k.startswith(module.name + "/"))
        assert held == module.params, module.name


def test_recompute_keeps_layer_inputs_and_rebuilds_one_layer(graph, model) -> None:
    op = graph.op("listen/hearing")
    plain = model.slice_memory(graph, op, 4, 0, 3)
    rc = model.slice_memory(graph, op, 4, 0, 3, recompute=True)
    cfg = model.config(op, 4, recompute=True)
    rows = -(-op.batch // cfg.dp) * 2 / cfg.tp  # per-device samples x bf16, per TP shard
    act = get_kind("transformer").activation_elements(dict(op.args), op.tokens)
    assert rc.kept == int(op.tokens * op.in_width * rows * 3)
    assert rc.working == int(act * rows)
    assert plain.kept == int(act * -(-op.batch // model.config(op, 4).dp) * 2 * 3)
    assert plain.working == 0 and rc.kept < plain.kept
    assert rc.parts == plain.parts


def test_an_lm_sink_holds_its_log_probabilities_through_the_loss_phase(graph, model) -> None:
    op = graph.op("listen/lm")  # 16 text tokens: the loss reads 15 positions
    dp = model.config(op, 2).dp
    rows = -(-op.batch // dp) * 15 * 2
    last = model.slice_memory(graph, op, 2, 5, 6)
    middle = model.slice_memory(graph, op, 2, 4, 5)
    # not kept for the waves' backward (the loss phase back-propagates them), but alive in
    # the loss phase with every kept activation, so they add up at the peak
    assert last.kept == middle.kept and middle.loss == 0
    assert last.loss == rows * (1000 + 2 * 256)
    assert last.working == rows * 1000  # the logits while the loss runs
    assert last.alone(2) - middle.alone(2) > last.loss


def test_forward_only_ops_keep_nothing_and_ignore_recompute(build_op, cluster) -> None:
    c = cluster(2)
    mlp = {"in": 32, "out": 32}
    op = build_op("mlp", mlp, batch=8, tokens=4, frozen=True, needs_backward=False, layers=3)
    one_layer = 4 * 32 * 4 * 2  # tokens x in x per-device samples x bf16
    assert slice_activations(op, 3, 2, 1, c, recompute=False) == (0, one_layer)
    assert slice_activations(op, 3, 2, 1, c, recompute=True) == (0, one_layer)
    assert backward_multiplier(op, recompute=True) == 1
    assert price(op, 2, 1, c, recompute=True) == price(op, 2, 1, c)


def test_backward_multipliers_with_and_without_recompute(build_op) -> None:
    mlp = {"in": 8, "out": 8}
    train = build_op("mlp", mlp, batch=2, tokens=2)
    frozen = build_op("mlp", mlp, batch=2, tokens=2, frozen=True)
    assert (backward_multiplier(train), backward_multiplier(train, True)) == (3, 4)
    assert (backward_multiplier(frozen), backward_multiplier(frozen, True)) == (2, 3)


def test_recompute_curves_pay_one_more_forward(graph, model) -> None:
    op = graph.op("caption/lm")
    base = model.curves(graph)[op.id]
    slow = model.curves(graph, recompute=frozenset({op.id}))[op.id]
    assert all(b > a for a, b in zip(base.seconds, slow.seconds, strict=True))
    c1, r1 = model.config(op, 1), model.config(op, 1, recompute=True)
    flops = op.forward_flops_per_layer
    from spindle_dsl.cost.analytic import compute_seconds

    assert c1.compute_s == pytest.approx(compute_seconds(3 * flops, graph.cluster))
    assert r1.compute_s == pytest.approx(compute_seconds(4 * flops, graph.cluster))
    # an op the set does not name keeps its curve
    other = graph.op("listen/lm")
    assert (
        model.curves(graph, recompute=frozenset({op.id}))[other.id] == model.curves(graph)[other.id]
    )


def test_tensor_parallel_recompute_repeats_the_forward_all_reduces(build_op, cluster) -> None:
    c = cluster(8)
    op = build_op("transformer", {"hidden": 1024, "heads": 16}, batch=64, tokens=512)
    plain, rc = price(op, 1, 8, c), price(op, 1, 8, c, recompute=True)
    assert rc.tp_comm_s == pytest.approx(plain.tp_comm_s * 3 / 2)


@pytest.mark.parametrize("profiled", [False, True])
@pytest.mark.parametrize(
    ("recompute", "stage", "k"),
    [(False, 1, 1), (True, 1, 1), (False, 0, 1), (True, 2, 4), (False, 1, 2)],
)
def test_the_allocation_table_matches_slice_memory_exactly(
    graph, profiled, recompute, stage, k
) -> None:
    model = make_cost_model(graph.cluster)
    if profiled:
        model = ProfiledCostModel(graph.cluster, linear_profile(graph, 2e-4, 1e-12))
    assert has_slice_memory(model)
    N = graph.cluster.devices
    for op in graph.metaops:
        for a, b in {(0, 1), (op.layers - 1, op.layers), (0, op.layers)}:
            levers = {"zero_stage": stage, "micro_batches": k}
            table = model.alone_bytes(graph, op, a, b, recompute, **levers)
            ns = model.allocations(op, recompute)
            assert ns == tuple(range(1, N + 1))  # a small cluster lists every allocation
            direct = [
                model.slice_memory(graph, op, n, a, b, recompute, **levers).alone(n) for n in ns
            ]
            assert list(table) == direct, (op.id, a, b)
            some = (N, 3, 1)
            assert model.alone_bytes(graph, op, a, b, recompute, ns=some, **levers) == tuple(
                model.slice_memory(graph, op, n, a, b, recompute, **levers).alone(n) for n in some
            )


def test_zero_stages_split_the_same_bytes_differently(cluster) -> None:
    """Stage 0 keeps the optimizer state whole on every holder, ZeRO-1 and ZeRO-2 shard it
    (they differ in when gradients live, not in the layout); a frozen part keeps its weights
    whatever the stage."""
    gpu, cpu = cluster(8), cluster(1, "cpu")
    assert [state_split(gpu, True, z) for z in (0, 1, 2)] == [(14, 0), (2, 12), (2, 12)]
    assert [state_split(cpu, True, z) for z in (0, 1, 2)] == [(12, 0), (4, 8), (4, 8)]
    assert {state_split(gpu, False, z) for z in (0, 1, 2)} == {(2, 0)}


@pytest.mark.parametrize(
    ("k", "stage", "forward_grads", "backward_grads"),
    [
        # one pass: no gradient at the end of the forward; the backward ends with every
        # gradient (stage 0) or the shards and one bucket in flight (ZeRO-1 and ZeRO-2)
        (1, 0, 0, "all"),
        (1, 1, 0, "bucket+shards"),
        (1, 2, 0, "bucket+shards"),
        # several passes: the accumulated gradients live through later forwards (stages 0, 1);
        # ZeRO-2 reduce-scatters every pass, so only its shards do
        (4, 0, "all", "all"),
        (4, 1, "all", "bucket+shards"),
        (4, 2, "shards", "bucket+shards"),
    ],
)
def test_gradients_count_where_the_runtime_keeps_them(
    cluster, k, stage, forward_grads, backward_grads
) -> None:
    life = gradient_life(cluster(8), micro_batches=k, zero_stage=stage)
    assert life.bucket == GRAD_BUCKET_ELEMENTS * 2  # bf16
    grads, shards = 3 * life.bucket, life.bucket // 4
    extra = {0: 0, "all": grads, "shards": shards}[forward_grads]
    at_backward = grads if backward_grads == "all" else life.bucket + shards
    for forward in (0, 10 * grads):  # the backward's moment, then the forward's, is the peak
        assert life.peak(forward, grads, shards) == max(forward + extra, at_backward)
    # arrays (one per device) alike
    many = life.peak(np.array([0.0, 10.0 * grads]), np.full(2, grads), np.full(2, shards))
    assert list(many) == [life.peak(0, grads, shards), life.peak(10 * grads, grads, shards)]


def test_zero2_shards_the_gradient_as_zero1_and_stage_0_keeps_the_optimizer(graph, model) -> None:
    op = graph.op("caption/lm")
    z1 = model.slice_memory(graph, op, 4, 0, op.layers)
    z2 = model.slice_memory(graph, op, 4, 0, op.layers, zero_stage=2)
    z0 = model.slice_memory(graph, op, 4, 0, op.layers, zero_stage=0)
    tp = model.config(op, 4).tp
    for a, b, c in zip(z1.parts, z2.parts, z0.parts, strict=True):
        assert a == b and a.grads > 0 and a.grads_sharded == a.grads * tp
        assert c.sharded == 0 and c.grads_sharded == 0
        assert c.replicated == a.replicated + a.sharded // tp and c.grads == a.grads
    assert z1.kept == z2.kept == z0.kept
    # one pass: ZeRO-1 and ZeRO-2 hold the same; stage 0 the whole optimizer state
    assert z1.alone(4) == z2.alone(4) < z0.alone(4)
    # several passes: ZeRO-1 carries whole gradients through the forwards, ZeRO-2 shards
    many = {
        z: model.slice_memory(graph, op, 4, 0, op.layers, zero_stage=z, micro_batches=4)
        for z in (1, 2)
    }
    grads = sum(p.grads for p in z1.parts)
    shards = sum(p.grad_share(4) for p in z1.parts)
    assert many[1].alone(4) - z1.alone(4) == grads
    assert many[2].alone(4) - z1.alone(4) == shards


def test_the_table_handles_mixed_tensor_parallel_degrees(graph) -> None:
    op = graph.op("caption/lm")
    info = op_memory_info(graph, op)
    dp = np.array([1, 2, 1, 4, 1, 3])
    tp = np.array([1, 1, 4, 1, 8, 2])
    from spindle_dsl.cost.memory import slice_memory

    configs = [(n, int(d), int(t)) for n, (d, t) in enumerate(zip(dp, tp, strict=True), start=1)]
    got = alone_bytes(info, op, 0, 2, configs, True, graph.cluster)
    want = [
        slice_memory(info, op, 0, 2, int(d), int(t), True, graph.cluster).alone(n)
        for n, (d, t) in enumerate(zip(dp, tp, strict=True), start=1)
    ]
    assert list(got) == want


def test_memory_bytes_alone_shards_the_optimizer_over_its_devices(build_op, cluster) -> None:
    c = cluster(8)
    op = build_op("mlp", {"in": 256, "out": 256}, batch=64, tokens=16)
    model = AnalyticCostModel(c)
    act = 16 * 256  # the first Linear's input, per sample

    def expected(n: int) -> int:
        cfg = model.config(op, n)
        params = op.params_per_layer * 2
        kept = act * (-(-64 // cfg.dp) * 2 / cfg.tp) * 2
        backward = params * 2 / cfg.tp + params * 2 / n  # a layer this small: one bucket
        return int(params * (2 / cfg.tp + 12 / n) + max(kept, backward))

    assert model.memory_bytes(op, 1, 2) == expected(1) == int(op.params_per_layer * 28) + act * 256
    assert model.memory_bytes(op, 8, 2) == expected(8) < expected(1)


def test_the_profiled_model_prices_recompute_at_one_more_forward(graph) -> None:
    model = ProfiledCostModel(graph.cluster, linear_profile(graph, 2e-4, 1e-12))
    op = graph.op("listen/hearing")
    plain = model.curves(graph)[op.id].at(1)
    slow = model.curves(graph, recompute=frozenset({op.id}))[op.id].at(1)
    assert plain == pytest.approx(2e-4 + 1e-12 * 3 * op.forward_flops_per_layer)
    assert slow == pytest.approx(2e-4 + 1e-12 * 4 * op.forward_flops_per_layer)
    assert (
        model.slice_memory(graph, op, 1, 0, 3, True).kept
        < model.slice_memory(graph, op, 1, 0, 3).kept
    )


TIED_SPEC = """
cluster { devices = 2; device = "cpu" }
modality text  { tokens = 8; vocab = 512 }
modality audio { tokens = 6; features = 10 }
encoder ear : transformer(layers = 2, hidden = 32, heads = 4) <- audio
shared lm : transformer(layers = 2, hidden = 32, heads = 4, causal = true, vocab = 512,
                        tie_embeddings = true)
task chat { text -> lm; loss = lm; batch = 4 }
task hear { audio -> ear -> lm; text[6] -> lm; loss = lm; batch = 4 }
"""


def test_a_tied_head_holds_the_embedding_it_multiplies_by() -> None:
    """The runtime keeps a tied head's embedding stage on the head's devices too, so a slice
    ending at an lm sink's last layer holds it, once even when it starts at layer 0."""
    graph = compile_text(TIED_SPEC).graph
    model = make_cost_model(graph.cluster)
    op = graph.op("chat/lm")
    info = op_memory_info(graph, op)
    assert info.tied is not None and info.tied == info.inputs[0]  # the same part, same bytes
    assert info.tied.key == "lm/input.text" and info.tied.sharded > 0

    def keys(a: int, b: int) -> list[str]:
        return [p.key for p in model.slice_memory(graph, op, 1, a, b).parts]

    assert keys(1, 2) == ["lm/layers.1-2", "lm/head", "lm/input.text"]
    assert keys(0, 2).count("lm/input.text") == 1
    assert "lm/input.text" not in keys(0, 1)[2:] and keys(0, 1)[-1] == "lm/input.text"
    untied = compile_text(TIED_SPEC.replace(",\n                        tie_embeddings = true", ""))
    assert op_memory_info(untied.graph, untied.graph.op("chat/lm")).tied is None
