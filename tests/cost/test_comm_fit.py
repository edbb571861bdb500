"""Communication pricing and the piecewise alpha-beta fit."""

from __future__ import annotations

import math
import random

import pytest

from spindle_dsl.cost import comm
from spindle_dsl.cost.comm import allreduce_seconds, ring_allreduce_seconds, transfer_seconds
from spindle_dsl.cost.fit import fit_piecewise


def test_ring_allreduce_formula() -> None:
    assert ring_allreduce_seconds(1e9, 1, 1e9, 1e-5) == 0.0
    # 4 ranks: 6 steps, each moving a quarter of the buffer.
    assert ring_allreduce_seconds(4e9, 4, 1e9, 1e-5) == pytest.approx(6e-5 + 6.0)


def test_allreduce_uses_network_when_group_crosses_nodes(cluster) -> None:
    c = cluster(16)
    inside = allreduce_seconds(1e9, range(8), c)
    across = allreduce_seconds(1e9, range(4, 12), c)
    assert inside == pytest.approx(ring_allreduce_seconds(1e9, 8, c.device.intra_bandwidth, 5e-6))
    flat = ring_allreduce_seconds(1e9, 8, c.device.inter_bandwidth, 1e-5)
    # 4 members on each of 2 nodes: node rings of 4, then 4 network rings of 2 on quarters
    hierarchical = ring_allreduce_seconds(
        1e9, 4, c.device.intra_bandwidth, 5e-6
    ) + ring_allreduce_seconds(1e9 / 4, 2, c.device.inter_bandwidth, 1e-5)
    assert comm.hierarchical_allreduce_seconds(1e9, range(4, 12), c) == pytest.approx(hierarchical)
    assert across == pytest.approx(hierarchical)
    assert inside < across < flat


def test_hierarchical_allreduce_is_bound_by_the_node_with_fewest_members(cluster) -> None:
    c = cluster(16)
    even = comm.hierarchical_allreduce_seconds(1e9, range(4, 12), c)  # 4 + 4 members
    lopsided = comm.hierarchical_allreduce_seconds(1e9, range(1, 9), c)  # 7 + 1 members
    # the lone member on the second node sends the whole buffer over its own network link
    assert lopsided == pytest.approx(
        ring_allreduce_seconds(1e9, 7, c.device.intra_bandwidth, 5e-6)
        + ring_allreduce_seconds(1e9, 2, c.device.inter_bandwidth, 1e-5)
    )
    assert lopsided > even
    # never priced above the flat ring: a lone member per node gains nothing from it
    spread = [0, 8]
    assert allreduce_seconds(1e9, spread, c) == pytest.approx(
        ring_allreduce_seconds(1e9, 2, c.device.inter_bandwidth, 1e-5)
    )


def test_cpu_groups_across_nodes_are_priced_as_a_flat_ring(cluster) -> None:
    c = cluster(8, device="cpu", per_node=4)
    bandwidth, latency = comm.link(c, True)
    assert allreduce_seconds(1e6, range(8), c) == pytest.approx(
        ring_allreduce_seconds(1e6, 8, bandwidth, latency)
    )


def test_transfer_is_free_on_the_same_devices_and_priced_otherwise(cluster) -> None:
    c = cluster(16)
    assert transfer_seconds(1e9, [0, 1], [0, 1], c) == 0.0
    # Two devices hand their halves to two others in the same node: each sends 0.5 GB.
    t = transfer_seconds(1e9, [0, 1], [2, 3], c)
    assert t == pytest.approx(5e-6 + 0.5e9 / c.device.intra_bandwidth)
    # Across nodes the network bounds it.
    assert transfer_seconds(1e9, [0, 1], [8, 9], c) == pytest.approx(
        1e-5 + 0.5e9 / c.device.inter_bandwidth
    )
    # Growing [0, 1] to [0, 1, 2, 3]: samples [0, 1/4) stay on device 0; [1/4, 1/2) go 0 -> 1,
    # [1/2, 3/4) go 1 -> 2 and [3/4, 1) go 1 -> 3, so device 1 is busiest, sending a half.
    grow = transfer_seconds(1e9, [0, 1], [0, 1, 2, 3], c)
    assert grow == pytest.approx(5e-6 + 0.5e9 / c.device.intra_bandwidth)
    # Shrinking [0, 1, 2, 3] to [0, 1]: [1/4, 1/2) go 1 -> 0, [1/2, 3/4) go 2 -> 1 and
    # [3/4, 1) go 3 -> 1, so device 1 is busiest, receiving a half.
    shrink = transfer_seconds(1e9, [0, 1, 2, 3], [0, 1], c)
    assert shrink == pytest.approx(5e-6 + 0.5e9 / c.device.intra_bandwidth)


@pytest.mark.parametrize("seed", range(4))
def test_shard_moves_agree_with_moving_sample_by_sample(seed) -> None:
    """With |src| x |dst| samples, every shard boundary of both splits falls on a sample, so
    moving each sample from the device that holds it to the one that needs it gives each
    pair's fraction exactly."""
    rng = random.Random(seed)
    for _ in range(50):
        src = rng.sample(range(40), rng.randint(1, 12))
        dst = rng.sample(range(40), rng.randint(1, 12))
        samples = len(src) * len(dst)
        want: dict[tuple[int, int], int] = {}
        for x in range(samples):
            pair = (src[x * len(src) // samples], dst[x * len(dst) // samples])
            if pair[0] != pair[1]:
                want[pair] = want.get(pair, 0) + 1
        assert comm._shard_moves(src, dst) == {k: v / samples for k, v in want.items()}


@pytest.mark.parametrize("seed", range(4))
def test_large_groups_are_priced_as_small_ones_are(cluster, seed, monkeypatch) -> None:
    """The numpy walk for large groups gives the per-pair loop's figure."""
    rng = random.Random(seed)
    c = cluster(rng.choice([300, 1000]), rng.choice(["cpu", "a100-80gb"]), rng.choice([1, 8]))
    for _ in range(20):
        src = rng.sample(range(c.devices), rng.randint(1, c.devices))
        dst = rng.sample(range(c.devices), rng.randint(1, c.devices))
        if rng.random() < 0.5:
            src, dst = sorted(src), sorted(dst)
        large = comm._transfer_seconds_large(1e8, src, dst, c)
        monkeypatch.setattr(comm, "LARGE_GROUPS", 10**9)
        assert large == pytest.approx(transfer_seconds(1e8, src, dst, c), rel=1e-12, abs=0)
        monkeypatch.undo()


def test_fit_recovers_a_line_exactly() -> None:
    samples = [(x, 2e-4 + 3e-9 * x) for x in (1e5, 2e5, 4e5, 8e5, 1.6e6)]
    fit = fit_piecewise(samples)
    assert len(fit.segments) == 1
    seg = fit.segments[0]
    assert seg.alpha_s == pytest.approx(2e-4, rel=1e-6)
    assert seg.beta_s_per_flop == pytest.approx(3e-9, rel=1e-6)
    assert fit.predict(3e6) == pytest.approx(2e-4 + 3e-9 * 3e6, rel=1e-6)


def test_fit_finds_two_regimes() -> None:
    # Overhead-bound for small work, then a steeper slope: one line cannot fit both.
    small = [(x, 1e-3 + 1e-10 * x) for x in (1e4, 2e4, 4e4)]
    large = [(x, 5e-9 * x) for x in (1e6, 2e6, 4e6)]
    fit = fit_piecewise(small + large)
    assert len(fit.segments) == 2
    for x, t in small + large:
        assert fit.predict(x) == pytest.approx(t, rel=1e-6)
    # The hand-over lies between the regimes; the ends are open.
    assert 4e4 < fit.segments[0].to_flops < 1e6
    assert fit.segments[0].from_flops == 0.0 and math.isinf(fit.segments[-1].to_flops)


def test_fit_coefficients_stay_non_negative() -> None:
    # Noisy timings that fall with work would give a negative slope; clamp it to 0.
    fit = fit_piecewise([(1.0, 3.0), (2.0, 2.0), (3.0, 1.0)], max_segments=1)
    seg = fit.segments[0]
    assert seg.alpha_s >= 0 and seg.beta_s_per_flop >= 0
    assert fit.predict(10.0) > 0


def test_fit_needs_a_positive_timing() -> None:
    with pytest.raises(ValueError):
        fit_piecewise([(1.0, 0.0)])
