"""Units in the cluster block: memory is binary (vendor GB), rates are decimal, b is bits."""

from __future__ import annotations

import pytest

from spindle_dsl.language import compile_text
from spindle_dsl.language.units import UnitError, bytes_per_second, memory_bytes


@pytest.mark.parametrize(
    ("amount", "unit", "expected"),
    [
        (80, "GB", 80 * 2**30),
        (80, "GiB", 80 * 2**30),
        (512, "MB", 512 * 2**20),
        (1.5, "TB", 1.5 * 2**40),
    ],
)
def test_memory_sizes(amount, unit, expected):
    assert memory_bytes(amount, unit) == expected


@pytest.mark.parametrize(
    ("amount", "unit", "expected"),
    [
        (25, "GB/s", 25e9),
        (400, "Gb/s", 50e9),
        (1, "TB/s", 1e12),
        (1, "GiB/s", 2**30),
        (8, "Mb/s", 1e6),
    ],
)
def test_rates(amount, unit, expected):
    assert bytes_per_second(amount, unit) == pytest.approx(expected)


def test_wrong_family_is_refused():
    with pytest.raises(UnitError, match="is a rate"):
        memory_bytes(80, "GB/s")
    with pytest.raises(UnitError, match="bytes"):
        memory_bytes(80, "Gb")
    with pytest.raises(UnitError, match="is a size"):
        bytes_per_second(25, "GB")


def test_cluster_block_applies_units_and_overrides():
    spec = (
        'cluster { devices = 16; device = "A100-40GB"; tflops = 100; memory = 24GB\n'
        "          intra_bandwidth = 100GB/s; inter_bandwidth = 100Gb/s }\n"
        "modality t { tokens = 2; vocab = 10 }\n"
        "module m : transformer(layers = 1, hidden = 8, heads = 2, causal = true, vocab = 10)\n"
        "task x { t -> m; batch = 1 }\n"
    )
    c = compile_text(spec).graph.cluster
    assert (c.devices, c.devices_per_node) == (16, 8)
    assert c.device.name == "A100-40GB"
    assert c.device.peak_flops == 100e12
    assert c.device.memory_bytes == 24 * 2**30
    assert c.device.intra_bandwidth == 100e9
    assert c.device.inter_bandwidth == 12.5e9
