"""Presets and overrides: the figures a cost model rests on."""

import pytest

from spindle_dsl.cluster import PRESETS, Cluster, GiB, preset


def test_every_preset_the_language_promises_exists():
    for name in ("cpu", "A100-40GB", "A100-80GB", "A800-80GB", "H100-80GB", "H200-141GB"):
        p = preset(name)
        assert p.peak_flops > 0 and p.memory_bytes > 0
        assert p.intra_bandwidth >= p.inter_bandwidth > 0
        assert p.source


def test_preset_lookup_ignores_case_and_names_the_known_ones():
    assert preset("h100-80gb") is PRESETS["h100-80gb"]
    with pytest.raises(KeyError, match="A100-80GB"):
        preset("V100")


def test_overrides_take_precedence_and_keep_the_rest():
    base = Cluster(devices=16, devices_per_node=8, device=preset("A800-80GB"))
    c = base.with_overrides(devices=4, memory_bytes=10 * GiB)
    assert c.devices == 4
    assert c.devices_per_node == 4  # a node cannot hold more devices than the cluster has
    assert c.device.memory_bytes == 10 * GiB
    assert c.device.peak_flops == base.device.peak_flops
    assert base.device.memory_bytes == 80 * GiB  # the original is untouched


def test_nodes_and_spans():
    c = Cluster(devices=20, devices_per_node=8, device=preset("cpu"))
    assert c.nodes == 3
    assert c.node_of(7) == 0 and c.node_of(8) == 1
    assert not c.spans_nodes((0, 7))
    assert c.spans_nodes((7, 8))
