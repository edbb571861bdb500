"""The DOT source of the MetaGraph and wave pictures, and (with dot) the drawn SVG."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from spindle_dsl.render.dot_metagraph import graph_view, metagraph_dot
from spindle_dsl.render.dot_waves import waves_dot
from spindle_dsl.render.graphviz_tools import render_dot


def _node(source: str, node_id: str) -> str:
    m = re.search(rf'^\s*"?{re.escape(node_id)}"? \[(.*)\]$', source, re.M)
    assert m, f"no node {node_id} in\n{source}"
    return m.group(1)


def test_metagraph_has_a_cluster_per_task_with_its_metaops(graph):
    src = metagraph_dot(graph).source
    assert src.count("subgraph cluster_task_") == 2
    caption = src.split("subgraph cluster_task_caption")[1].split("subgraph")[0]
    for mid in ("caption/vision", "caption/vision_proj", "caption/lm"):
        assert f'"{mid}"' in caption
    assert "transcribe/" not in caption


def test_metaop_label_says_module_L_batch_tokens_and_flops(graph):
    label = _node(metagraph_dot(graph).source, "caption/lm")
    assert "<b>lm</b>" in label
    assert "L=6" in label
    assert "24 × 28 tok" in label
    assert "fwd 24 GFLOP" in label  # 4e9 per layer x 6 layers


def test_frozen_metaops_are_marked(graph):
    src = metagraph_dot(graph).source
    frozen = _node(src, "caption/vision")
    assert "dashed" in frozen and "frozen" in frozen
    trained = _node(src, "transcribe/hearing")
    assert "dashed" not in trained and "frozen" not in trained


def test_shared_module_copies_are_marked_and_linked(graph):
    src = metagraph_dot(graph).source
    for mid in ("caption/lm", "transcribe/lm"):
        label = _node(src, mid)
        assert "peripheries=2" in label
        assert "shared by 2 MetaOps · 23.4 KiB" in label  # 6000 params x 4 bytes
    assert re.search(r'"caption/lm" -> "transcribe/lm" \[[^\]]*style=dashed', src)
    assert "peripheries=1" in _node(src, "caption/vision")
    assert "shared by" not in _node(src, "caption/vision")


def test_modalities_and_dependencies_are_edges(graph):
    src = metagraph_dot(graph).source
    assert re.search(r'modality__image -> "caption/vision" \[label="16 tok"\]', src)
    assert '"caption/vision" -> "caption/vision_proj"' in src
    assert '"transcribe/audio_proj" -> "transcribe/lm"' in src


def test_metagraph_from_a_plan_file_keeps_tasks_and_sharing(plan):
    view = graph_view(plan)
    assert [t for t, _ in view.tasks] == ["caption", "transcribe"]
    assert [s.module for s in view.shared] == ["lm"]
    assert all(op.frozen is None for op in view.ops)
    src = metagraph_dot(plan).source
    assert src.count("subgraph cluster_task_") == 2 and "frozen" not in src


def test_waves_in_order_with_entries_layers_and_devices(plan):
    src = waves_dot(plan).source
    starts = [src.index(f"subgraph cluster_wave_{k}") for k in range(4)]
    assert starts == sorted(starts)
    label = _node(src, "w3/caption/lm")
    assert "layers 3-6 of 6" in label and "devices 0-1 (2)" in label and "96 ms" in label
    assert "layers 0-3 of 6" in _node(src, "w2/caption/lm")


def test_waves_show_idle_devices(plan):
    src = waves_dot(plan).source
    assert "devices 1, 3 (2)" in _node(src, "w1/idle")
    assert '"w2/idle"' not in src  # wave 2 uses all four devices


def test_waves_draw_each_crossing_flow_once(plan):
    src = waves_dot(plan).source
    flows = re.findall(r'"(w\d/[^"]+)" -> "(w\d/[^"]+)" \[(?!style=invis)', src)
    assert sorted(flows) == sorted(
        [
            ("w0/caption/vision", "w1/caption/vision_proj"),
            ("w0/transcribe/hearing", "w1/transcribe/audio_proj"),
            ("w1/caption/vision_proj", "w2/caption/lm"),
            ("w1/transcribe/audio_proj", "w3/transcribe/lm"),
            ("w2/caption/lm", "w3/caption/lm"),
        ]
    )


@pytest.mark.needs_dot
def test_dot_draws_both_pictures_as_svg(graph, plan):
    for dot, expect in ((metagraph_dot(graph), "vision_proj"), (waves_dot(plan), "wave 3")):
        svg = render_dot(dot, "svg").decode()
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg")
        assert expect in "".join(root.itertext())


@pytest.mark.needs_dot
def test_dot_draws_png_and_pdf(plan):
    assert render_dot(waves_dot(plan), "png").startswith(b"\x89PNG")
    assert render_dot(waves_dot(plan), "pdf").startswith(b"%PDF")
