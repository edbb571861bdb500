"""The analytic model: physical floors, uneven splits, TP choice, gradient sync, memory."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.analytic import (
    AnalyticCostModel,
    backward_multiplier,
    best_config,
    compute_seconds,
    price,
    tp_degrees,
)
from spindle_dsl.cost.comm import ring_allreduce_seconds
from spindle_dsl.metagraph import MetaGraph

LLM = {"layers": 32, "hidden": 4096, "heads": 32, "ffn": 11008, "causal": True}
VIT = {"layers": 12, "hidden": 384, "heads": 8, "patch": 14}


def graph_of(cluster, *ops, devices: int = 16) -> MetaGraph:
    return MetaGraph(
        metaops=tuple(ops),
        tasks=(),
        modules=(),
        modalities=(),
        cluster=cluster(devices),
        mix=None,
        dtype_bytes=2,
    )


def test_multiplier_by_training_mode(build_op, cluster) -> None:
    assert backward_multiplier(build_op("vit", VIT, batch=4, tokens=16)) == 3
    frozen = build_op("vit", VIT, batch=4, tokens=16, frozen=True)
    assert backward_multiplier(frozen) == 2
    inert = build_op("vit", VIT, batch=4, tokens=16, frozen=True, needs_backward=False)
    assert backward_multiplier(inert) == 1


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 600),
    tokens=st.integers(1, 700),
    devices=st.integers(1, 40),
    kind=st.sampled_from(["llm", "vit", "mlp", "resampler"]),
    device=st.sampled_from(["cpu", "a100-40gb", "h100-80gb"]),
)
def test_never_faster_than_peak_and_never_slower_with_more_devices(
    build_op, cluster, batch, tokens, devices, kind, device
) -> None:
    op = {
        "llm": lambda: build_op("transformer", LLM, batch=batch, tokens=tokens),
        "vit": lambda: build_op("vit", VIT, batch=batch, tokens=tokens),
        "mlp": lambda: build_op("mlp", {"in": 1280, "out": 4096}, batch=batch, tokens=tokens),
        "resampler": lambda: build_op(
            "resampler",
            {"in": 1664, "hidden": 4096, "heads": 32, "out_tokens": 256},
            batch=batch,
            tokens=tokens,
        ),
    }[kind]()
    c = cluster(devices, device)
    work = 3 * op.forward_flops_per_layer
    seconds = [best_config(op, c, n).seconds for n in range(1, devices + 1)]
    for n, t in enumerate(seconds, start=1):
        assert t >= work / (n * c.device.peak_flops)
    assert all(b <= a for a, b in itertools.pairwise(seconds))


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 300),
    devices=st.integers(1, 70),
    per_node=st.sampled_from([1, 4, 8]),
    kind=st.sampled_from(["llm", "vit", "mlp"]),
    frozen=st.booleans(),
)
def test_pricing_only_shard_breakpoints_is_exact(
    build_op, cluster, batch, devices, per_node, kind, frozen
) -> None:
    """T(n) from the configurations at the batch's shard breakpoints equals the fastest of
    every (dp, tp) with dp * tp <= n, priced one by one, for every n."""
    op = {
        "llm": lambda: build_op("transformer", LLM, batch=batch, tokens=64, frozen=frozen),
        "vit": lambda: build_op("vit", VIT, batch=batch, tokens=50, frozen=frozen),
        "mlp": lambda: build_op("mlp", {"in": 512, "out": 4096}, batch=batch, tokens=9),
    }[kind]()
    c = cluster(devices, per_node=per_node)
    best = float("inf")
    for n in range(1, devices + 1):
        for tp in tp_degrees(op, c):
            if n % tp == 0:
                best = min(best, price(op, n // tp, tp, c).seconds)
        assert best_config(op, c, n).seconds == best, n


def test_a_large_cluster_lists_the_allocations_that_matter(build_op, cluster) -> None:
    op = build_op("vit", VIT, batch=1536, tokens=257)
    c = cluster(65536)
    model = AnalyticCostModel(c)
    ns = model.allocations(op)
    assert len(ns) < 400  # not 65,536
    assert set(range(1, 65)) <= set(ns)
    assert {1 << k for k in range(17)} <= set(ns)  # powers of two, divisors of N, N
    assert 65536 in ns and 8 * 3 in ns  # whole nodes
    curve = model.curves(graph_of(cluster, op, devices=65536))[op.id]
    assert curve.ns == ns
    for n, t in curve.items():
        assert t == model.config(op, n).seconds
    # every step of T(n) up to the fastest is listed, at least every 1/32 faster
    fastest = min(curve.seconds)
    assert curve.at(65536) == fastest and fastest <= curve.at(64)


def test_uneven_split_costs_the_largest_shard(build_op, cluster) -> None:
    c = cluster(8, "cpu")
    op = build_op("vit", VIT, batch=10, tokens=50, dtype_bytes=4)
    cfg = price(op, 3, 1, c)
    assert cfg.compute_s == pytest.approx(
        compute_seconds(3 * op.forward_flops_per_layer * 4 / 10, c)
    )
    # n = 3 is a valid allocation even though 3 does not divide the batch.
    assert best_config(op, c, 3).devices == 3


def test_tp_degrees_divide_heads_and_fit_a_node(build_op, cluster) -> None:
    c = cluster(64)
    assert tp_degrees(build_op("vit", VIT, batch=1, tokens=1), c) == (1, 2, 4, 8)
    twelve = build_op("vit", {**VIT, "hidden": 768, "heads": 12}, batch=1, tokens=1)
    assert tp_degrees(twelve, c) == (1, 2, 3, 4, 6)
    assert tp_degrees(twelve, cluster(64, per_node=4)) == (1, 2, 3, 4)


def test_large_layer_uses_tensor_parallel_when_data_parallel_runs_out(build_op, cluster) -> None:
    # 4 samples cannot feed 32 data-parallel replicas; splitting each layer must win.
    op = build_op("transformer", LLM, batch=4, tokens=2048)
    cfg = best_config(op, cluster(32), 32)
    assert cfg.tp > 1 and cfg.used > 4
    assert cfg.seconds < best_config(op, cluster(32), 4).seconds


def test_gradient_sync_only_when_training_and_slower_across_nodes(build_op, cluster) -> None:
    c = cluster(32)
    op = build_op("vit", VIT, batch=256, tokens=257)
    frozen = build_op("vit", VIT, batch=256, tokens=257, frozen=True)
    assert price(frozen, 8, 1, c).grad_sync_s == 0.0
    intra = price(op, 8, 1, c).grad_sync_s
    bw = c.device.intra_bandwidth
    assert intra == pytest.approx(
        ring_allreduce_seconds(op.param_bytes_per_layer, 8, bw, 5e-6), rel=1e-9
    )
    across = price(op, 16, 1, c).grad_sync_s
    assert across > 2 * intra  # the network is much slower than NVLink


def test_memory_of_a_slice(build_op, cluster) -> None:
    c = cluster(8)
    op = build_op("vit", VIT, batch=64, tokens=257)
    model = AnalyticCostModel(c)
    cfg = model.config(op, 8)
    from spindle_dsl.kinds import get_kind

    act = get_kind("vit").activation_elements(dict(op.args), 257)
    # bf16 weights (2 B) per tensor-parallel shard; fp32 master + Adam (12 B) sharded over the
    # 8 devices (distributed optimizer); then the larger moment: every layer's activations
    # kept at the end of the forward, or the gradients (2 B, at most a 16 MiB bucket whole,
    # and this device's shard) in the backward
    params = op.params_per_layer * 4
    kept = act * 2 * -(-64 // cfg.dp) * 4 / cfg.tp
    backward = min(params * 2 / cfg.tp, 2**22 * 2) + params * 2 / 8
    expected = params * (2 / cfg.tp + 12 / 8) + max(kept, backward)
    assert model.memory_bytes(op, 8, 4) == int(expected)
    frozen = build_op("vit", VIT, batch=64, tokens=257, frozen=True, needs_backward=False)
    fcfg = model.config(frozen, 1)
    assert fcfg.tp == 1
    one_layer_act = act * 2 * 64
    assert model.memory_bytes(frozen, 1, 4) == int(frozen.params_per_layer * 4 * 2 + one_layer_act)


def test_cpu_memory_is_fp32(build_op, cluster) -> None:
    c = cluster(1, "cpu")
    op = build_op("mlp", {"in": 8, "out": 8}, batch=2, tokens=3, dtype_bytes=4, frozen=True)
    model = AnalyticCostModel(c)
    # frozen on cpu: 4 bytes per parameter; activations 2 x 3 tokens x 8 wide x 4 bytes.
    assert model.memory_bytes(op, 1, 1) == op.params_per_layer * 4 + 2 * 3 * 8 * 4


def test_curves_cover_every_n_for_every_op(build_op, cluster) -> None:
    ops = (
        build_op("vit", VIT, batch=100, tokens=257, op_id="a/vision"),
        build_op("mlp", {"in": 384, "out": 1024}, batch=100, tokens=257, op_id="a/head"),
    )
    model = make_cost_model(cluster(16))
    curves = model.curves(graph_of(cluster, *ops))
    assert curves.source == "analytic"
    for op in ops:
        curve = curves[op.id]
        assert curve.ns == tuple(range(1, 17))
        assert curve.at(16) <= curve.at(1)
