"""Communication prices: ring all-reduce and activation re-sharding between device groups.

Both cost models share these, since a profile on one machine cannot measure the cluster's
links: a collective is priced from the cluster's per-device bandwidths (NVLink inside a node,
the network across nodes) plus a fixed latency per ring step. The latencies are assumptions
(typical NCCL/gloo small-message latencies), documented here so they are easy to revisit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spindle_dsl.cluster import Cluster

# Seconds per point-to-point step of a collective (assumed; typical small-message latencies).
GPU_INTRA_LATENCY_S = 5e-6  # NCCL over NVLink
GPU_INTER_LATENCY_S = 10e-6  # NCCL over InfiniBand
CPU_LATENCY_S = 50e-6  # gloo over TCP / shared memory


def is_cpu(cluster: Cluster) -> bool:
    return cluster.device.name.lower() == "cpu"


def link(cluster: Cluster, crosses_nodes: bool) -> tuple[float, float]:
    """(bytes/s, latency s) of one link, inside a node or across nodes."""
    if is_cpu(cluster):
        latency = CPU_LATENCY_S
    else:
        latency = GPU_INTER_LATENCY_S if crosses_nodes else GPU_INTRA_LATENCY_S
    bandwidth = cluster.device.inter_bandwidth if crosses_nodes else cluster.device.intra_bandwidth
    return bandwidth, latency


def ring_allreduce_seconds(nbytes: float, group: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``group`` ranks: reduce-scatter then all-gather, each
    ``group - 1`` steps moving ``nbytes / group`` per rank (bandwidth-optimal)."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    steps = 2 * (group - 1)
    return steps * latency + steps * (nbytes / group) / bandwidth


def allreduce_seconds(nbytes: float, devices: Sequence[int], cluster: Cluster) -> float:
    """All-reduce over the given device ids. Inside one node, a ring on the node's links.
    Across nodes, a flat ring is bound by the network link; on GPUs the cheaper of that and
    the hierarchical schedule (``hierarchical_allreduce_seconds``), which is what NCCL's
    topology-aware algorithms reach on nodes with a network link per device (one ring per
    rail); gloo on CPU has no such algorithm, so CPU groups are priced flat.
    (Nodes hold consecutive ids, so the group spans nodes iff its extremes do.)"""
    if len(devices) == 0:
        return 0.0
    per = cluster.devices_per_node
    crosses = min(devices) // per != max(devices) // per
    bandwidth, latency = link(cluster, crosses)
    flat = ring_allreduce_seconds(nbytes, len(set(devices)), bandwidth, latency)
    if not crosses or is_cpu(cluster):
        return flat
    return min(flat, hierarchical_allreduce_seconds(nbytes, devices, cluster))


def hierarchical_allreduce_seconds(
    nbytes: float, devices: Sequence[int], cluster: Cluster
) -> float:
    """All-reduce over a group spanning nodes, intra-node first: a reduce-scatter among each
    node's members (node links), then each member all-reduces its shard with its
    counterparts on the other nodes (one ring per member, each on its own network link, in
    parallel), then an all-gather inside each node. The node with the fewest members holds the
    largest shards, so it bounds the network phase: with m members there and q nodes,
    ``2 (m-1)/m B / intra + 2 (q-1)/q (B / m) / inter`` plus each phase's step latencies."""
    members: dict[int, int] = {}
    per = cluster.devices_per_node  # (``Cluster.node_of``)
    for d in set(devices):
        members[d // per] = members.get(d // per, 0) + 1
    if nbytes <= 0 or len(devices) <= 1:
        return 0.0
    nodes = len(members)
    inner = max(members.values())  # the longest intra-node ring
    fewest = min(members.values())  # the largest shard crossing the network
    intra_bw, intra_lat = link(cluster, False)
    inter_bw, inter_lat = link(cluster, True)
    local = ring_allreduce_seconds(nbytes, inner, intra_bw, intra_lat)  # scatter + gather
    across = ring_allreduce_seconds(nbytes / fewest, nodes, inter_bw, inter_lat)
    return local + across


def contiguous_group_spans_nodes(group: int, cluster: Cluster) -> bool:
    """Whether ``group`` devices packed onto whole nodes must cross a node boundary."""
    return group > cluster.devices_per_node


def _shard_moves(src: Sequence[int], dst: Sequence[int]) -> dict[tuple[int, int], float]:
    """Fraction of the batch each (src device, dst device) pair must move.

    Samples are split evenly and contiguously over ``src`` (in order) and must end up split the
    same way over ``dst``. Walking the breakpoints of both splits gives, for each stretch of
    samples, which device holds it and which needs it; stretches that stay put cost nothing.
    The walk counts in units of 1 / (|src| |dst|), where every breakpoint of both splits is a
    whole number (source shard i ends at (i + 1) |dst|, destination shard j at (j + 1) |src|):
    a merge of two sorted integer sequences, exact, with no sort and no rounding.
    """
    S, D = len(src), len(dst)
    total = S * D
    counts: dict[tuple[int, int], int] = {}
    i = j = at = 0
    while at < total:
        src_end, dst_end = (i + 1) * D, (j + 1) * S
        end = min(src_end, dst_end)
        s, d = src[i], dst[j]
        if s != d:
            counts[s, d] = counts.get((s, d), 0) + end - at
        at = end
        i += end == src_end
        j += end == dst_end
    return {pair: units / total for pair, units in counts.items()}


def busiest_bytes(nbytes: float, src: Sequence[int], dst: Sequence[int]) -> float:
    """Bytes the busiest device sends or receives when ``nbytes`` re-shard from ``src`` to
    ``dst`` (0 when nothing moves)."""
    if not src or not dst or nbytes <= 0:
        return 0.0
    busy: dict[tuple[str, int], float] = {}
    for (s, d), fraction in _shard_moves(list(src), list(dst)).items():
        busy[("send", s)] = busy.get(("send", s), 0.0) + fraction * nbytes
        busy[("recv", d)] = busy.get(("recv", d), 0.0) + fraction * nbytes
    return max(busy.values(), default=0.0)


def transfer_seconds(
    nbytes: float, src: Sequence[int], dst: Sequence[int], cluster: Cluster
) -> float:
    """Re-shard ``nbytes`` of activations from ``src`` to ``dst``; 0 when nothing moves.

    Each device sends and receives its pieces one after the other over its own link; devices
    work in parallel, so the busiest device's send or receive time bounds the transfer.
    """
    if not src or not dst or nbytes <= 0:
        return 0.0
    if len(src) + len(dst) > LARGE_GROUPS:
        return _transfer_seconds_large(nbytes, src, dst, cluster)
    moves = _shard_moves(src, dst)
    if not moves:
        return 0.0
    links = (link(cluster, False), link(cluster, True))
    per = cluster.devices_per_node
    send: dict[int, float] = {}
    recv: dict[int, float] = {}
    worst_latency = 0.0
    for (s, d), fraction in moves.items():
        bandwidth, latency = links[s // per != d // per]
        seconds = fraction * nbytes / bandwidth
        send[s] = send.get(s, 0.0) + seconds
        recv[d] = recv.get(d, 0.0) + seconds
        worst_latency = max(worst_latency, latency)
    return worst_latency + max(max(send.values()), max(recv.values()))


LARGE_GROUPS = 512  # devices in both groups above which the transfer is priced with numpy


def _transfer_seconds_large(
    nbytes: float, src: Sequence[int], dst: Sequence[int], cluster: Cluster
) -> float:
    """``transfer_seconds`` for large groups: the same walk over the breakpoints of both
    splits, as arrays (each (src, dst) device pair meets in one stretch of samples)."""
    S, D = len(src), len(dst)
    cuts = np.union1d(np.arange(S + 1) / S, np.arange(D + 1) / D)
    lo, hi = cuts[:-1], cuts[1:]
    mid = (lo + hi) / 2
    s = np.asarray(src)[np.minimum((mid * S).astype(int), S - 1)]
    d = np.asarray(dst)[np.minimum((mid * D).astype(int), D - 1)]
    moving = s != d
    if not moving.any():
        return 0.0
    s, d, fraction = s[moving], d[moving], (hi - lo)[moving]
    crosses = s // cluster.devices_per_node != d // cluster.devices_per_node
    intra, inter = link(cluster, False), link(cluster, True)
    bandwidth = np.where(crosses, inter[0], intra[0])
    latency = max(inter[1] if crosses.any() else 0.0, intra[1] if not crosses.all() else 0.0)
    seconds = fraction * nbytes / bandwidth
    send = np.bincount(s, weights=seconds)
    recv = np.bincount(d, weights=seconds)
    return latency + float(max(send.max(), recv.max()))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "allreduce_seconds",
    "busiest_bytes",
    "ceil_div",
    "contiguous_group_spans_nodes",
    "hierarchical_allreduce_seconds",
    "is_cpu",
    "link",
    "ring_allreduce_seconds",
    "transfer_seconds",
]


class LinkPricing:
    """The communication half of the CostModel protocol, the same for every compute model:
    analytic and profiled models differ in how long layers take, not in what links cost."""

    def transfer_seconds(
        self, nbytes: float, src: Sequence[int], dst: Sequence[int], cluster: Cluster
    ) -> float:
        return transfer_seconds(nbytes, src, dst, cluster)

    def allreduce_seconds(self, nbytes: float, devices: Sequence[int], cluster: Cluster) -> float:
        return allreduce_seconds(nbytes, devices, cluster)

    def step_model(self, graph):  # -> cost.step.StepModel
        """The runtime's whole step around the waves (``cost.step``) with the datasheet
        figures; the curves carry each layer's gradient all-reduce, so the step adds only what
        shared modules cost beyond them (``planner.evaluate.timing.grad_sync_seconds``)."""
        from spindle_dsl.cost.overheads import analytic_overheads
        from spindle_dsl.cost.step import make_step_model

        return make_step_model(graph, analytic_overheads(graph.cluster), grad_in_curves=True)
