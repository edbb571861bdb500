"""The layouts the cost models price are the ones the runtime runs: every tensor-parallel point
of every curve of the bundled and benchmark specs is a degree the runtime splits each of the
MetaOp's modules into, and ``--tp K`` forces K-way on every entry that can run it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spindle_dsl.backends.torch.tensor_parallel import layout_of
from spindle_dsl.cost import make_cost_model
from spindle_dsl.kinds import get_kind
from spindle_dsl.kinds.tp_split import tp_ok
from spindle_dsl.language import compile_file

REPO = Path(__file__).resolve().parents[2]
SPECS = sorted(
    [
        *(REPO / "tests" / "fixtures" / "spec").glob("*.spindle"),
        *(REPO / "examples").glob("*.spindle"),
        *(REPO / "bench" / "specs").glob("*.spindle"),
    ]
)
GPU = {"device": "H100-80GB", "devices": 64, "devices_per_node": 8}


def _graph(path: Path, overrides: dict | None = None):
    return compile_file(path, cluster_overrides=overrides).graph


def _split_points(graph, cost):
    """(op, n, dp, tp) of every tensor-parallel point of the model's curves."""
    for curve in cost.curves(graph):
        op = graph.op(curve.metaop)
        for n in curve.ns:
            dp, tp = curve.layout(n)
            if tp > 1:
                yield op, n, dp, tp


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_tensor_parallel_point_is_one_the_runtime_runs(path):
    graph = _graph(path, GPU)
    seen = 0
    for op, n, dp, tp in _split_points(graph, make_cost_model(graph.cluster)):
        assert dp * tp <= n
        for name, _ in op.segments:
            info = graph.module(name)
            assert tp_ok(info.kind, dict(info.args), tp) is None, (op.id, n, tp)
            kind = get_kind(info.kind)
            with torch.device("meta"):
                layer = kind.build_layer(kind.resolve(dict(info.args)), last=False)
            assert layout_of(layer).problem(tp) is None, (op.id, name, tp)
        seen += 1
    if path.stem == "qwen_val":
        assert seen, "its GPU curves use tensor parallelism"


def test_the_resampler_and_frozen_towers_price_what_the_runtime_runs():
    # the resampler has no tensor-parallel form in the runtime: data parallel only
    graph = _graph(REPO / "bench" / "specs" / "flamingo_like.spindle", GPU)
    points = list(_split_points(graph, make_cost_model(graph.cluster)))
    assert all(op.kind != "resampler" for op, *_ in points)


@pytest.mark.parametrize("k", [2, 4])
def test_forced_degree_runs_every_entry_on_k_or_more_devices_k_way(spec_dir, k):
    graph = _graph(spec_dir / "multitask_clip.spindle", GPU)
    cost = make_cost_model(graph.cluster, tp=k)
    for curve in cost.curves(graph):
        op = graph.op(curve.metaop)
        splits = tp_ok(op.kind, dict(op.args), k) is None and op.kind in (
            "transformer",
            "vit",
            "mlp",
        )
        for n in curve.ns:
            _, tp = curve.layout(n)
            assert tp == (k if splits and n >= k else 1), (op.id, n)


def test_data_parallel_only(spec_dir):
    graph = _graph(spec_dir / "multitask_clip.spindle", GPU)
    assert not list(_split_points(graph, make_cost_model(graph.cluster, tp=1)))


def test_a_tensor_parallel_layer_keeps_its_weights_whole_in_the_memory_model(spec_dir):
    """The runtime holds a tensor-parallel layer whole on each rank: only its activations
    shrink with the degree."""
    from spindle_dsl.cost.memory import layer_parts, slice_activations

    graph = _graph(spec_dir / "qwen_val.spindle", GPU)
    op = next(o for o in graph.metaops if o.kind == "transformer" and o.batch > 1)
    one = layer_parts(op, 0, op.layers, 1, graph.cluster)
    four = layer_parts(op, 0, op.layers, 4, graph.cluster)
    assert one == four
    kept1, _ = slice_activations(op, op.layers, 1, 1, graph.cluster, False)
    kept4, _ = slice_activations(op, op.layers, 1, 4, graph.cluster, False)
    assert kept1 / 4 < kept4 < kept1
