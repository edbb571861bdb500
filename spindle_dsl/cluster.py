"""Devices and clusters: the hardware a plan is made for.

A ``DevicePreset`` holds the public datasheet figures a cost model rests on; a ``Cluster`` is a
number of identical devices grouped into nodes, with any overrides from the spec or the command
line already applied. Bandwidths are bytes per second in one direction per device, the figure
that bounds a ring collective or a point-to-point send.

CPU devices are worker processes, and processes share the machine's cores: a plan for 4 ``cpu``
devices run on a 2-core laptop has, whenever all four compute at once, half a core each. So a
cluster of ``cpu`` devices knows its ``cores`` (how many cores its devices share), by default the
cores this process may run on (``os.sched_getaffinity``, which honours ``taskset`` and container
CPU sets) at planning time; ``--cores`` overrides it. The step model (``cost.step``) prices the
sharing per wave: the devices that compute in a wave share ``cores`` cores fairly (processor
sharing, the way the OS scheduler time-slices single-threaded workers), and devices that only
wait (a gloo rank blocked in a receive sleeps) cost nothing. GPU devices never share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

GiB = 2**30
GB_PER_S = 1e9
Gb_PER_S = 1e9 / 8


@dataclass(frozen=True)
class DevicePreset:
    """One accelerator model as its datasheet describes it."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s (fp32 for "cpu"); no sparsity figures
    memory_bytes: int  # device memory as the vendor sizes it (80GB parts report 80 GiB)
    intra_bandwidth: float  # bytes/s one direction per device inside a node (NVLink)
    inter_bandwidth: float  # bytes/s one direction per device across nodes (network)
    source: str  # where the figures come from


PRESETS: dict[str, DevicePreset] = {
    p.name.lower(): p
    for p in (
        DevicePreset(
            "cpu",
            peak_flops=1.2e11,
            memory_bytes=4 * GiB,
            intra_bandwidth=2 * GB_PER_S,
            inter_bandwidth=1 * Gb_PER_S,
            source="one CPU worker process on one thread: fp32 matmul peak taken as 120 GFLOP/s "
            "(tiny_mm's caption/lm layer measured 94 GFLOP/s forward+backward on this project's "
            "2-core CI machine with `spindle profile`); 4 GiB; gloo over shared memory inside a "
            "machine, 1 Gb/s Ethernet between machines (assumed; `spindle profile` measures the "
            "real compute figures)",
        ),
        # The GPU presets' peaks are datasheet figures; what fraction of them a layer reaches
        # is the analytic model's (``cost.analytic.GPU_MODEL``), checked against torchtitan's
        # published Llama 3 / 3.1 8B runs on A100s and H100s by ``bench/published_runs.py``.
        DevicePreset(
            "A100-40GB",
            peak_flops=312e12,
            memory_bytes=40 * GiB,
            intra_bandwidth=300 * GB_PER_S,
            inter_bandwidth=200 * Gb_PER_S,
            source="NVIDIA A100 datasheet (SXM): 312 TFLOP/s dense BF16, 40 GB HBM2, NVLink 3 "
            "600 GB/s bidirectional; one HDR InfiniBand 200 Gb/s NIC per GPU",
        ),
        DevicePreset(
            "A100-80GB",
            peak_flops=312e12,
            memory_bytes=80 * GiB,
            intra_bandwidth=300 * GB_PER_S,
            inter_bandwidth=200 * Gb_PER_S,
            source="NVIDIA A100 datasheet (SXM): 312 TFLOP/s dense BF16, 80 GB HBM2e, NVLink 3 "
            "600 GB/s bidirectional; one HDR InfiniBand 200 Gb/s NIC per GPU",
        ),
        DevicePreset(
            "A800-80GB",
            peak_flops=312e12,
            memory_bytes=80 * GiB,
            intra_bandwidth=200 * GB_PER_S,
            inter_bandwidth=200 * Gb_PER_S,
            source="NVIDIA A800 (SXM) product brief: 312 TFLOP/s dense BF16, 80 GB HBM2e, "
            "NVLink 400 GB/s bidirectional; one HDR InfiniBand 200 Gb/s NIC per GPU",
        ),
        DevicePreset(
            "H100-80GB",
            peak_flops=989e12,
            memory_bytes=80 * GiB,
            intra_bandwidth=450 * GB_PER_S,
            inter_bandwidth=400 * Gb_PER_S,
            source="NVIDIA H100 datasheet (SXM): 989 TFLOP/s dense BF16, 80 GB HBM3, NVLink 4 "
            "900 GB/s bidirectional; one NDR InfiniBand 400 Gb/s NIC per GPU",
        ),
        DevicePreset(
            "H200-141GB",
            peak_flops=989e12,
            memory_bytes=141 * GiB,
            intra_bandwidth=450 * GB_PER_S,
            inter_bandwidth=400 * Gb_PER_S,
            source="NVIDIA H200 datasheet (SXM): 989 TFLOP/s dense BF16, 141 GB HBM3e, NVLink 4 "
            "900 GB/s bidirectional; one NDR InfiniBand 400 Gb/s NIC per GPU",
        ),
    )
}


def preset(name: str) -> DevicePreset:
    """Look a preset up by name, case-insensitively; raises KeyError with the known names."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        known = ", ".join(p.name for p in PRESETS.values())
        raise KeyError(f"unknown device preset '{name}' (known: {known})") from None


CORES_ENV = "SPINDLE_CORES"  # overrides the detected count (the tests pin it: plans of cpu
# clusters would otherwise depend on the machine that runs them)


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; the CPU count where the platform
    has no affinity call), or ``$SPINDLE_CORES`` when set."""
    pinned = os.environ.get(CORES_ENV, "").strip()
    if pinned.isdigit() and int(pinned) >= 1:
        return int(pinned)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Cluster:
    """``devices`` identical devices, ``devices_per_node`` to a node, ids 0..devices-1 in order.

    ``cores``: CPU cores the devices of one node share, for ``cpu`` devices (None: the planning
    machine's usable cores, see the module docstring); ignored for GPUs."""

    devices: int
    devices_per_node: int
    device: DevicePreset
    cores: int | None = None

    def __post_init__(self) -> None:
        assert self.devices >= 1, "a cluster needs at least one device"
        assert self.devices_per_node >= 1, "a node holds at least one device"
        assert self.cores is None or self.cores >= 1, "a node has at least one core"

    @property
    def shared_cores(self) -> int | None:
        """Cores one node's devices share, or None when each device computes on its own (GPUs,
        or a node with at least as many cores as devices)."""
        if self.device.name.lower() != "cpu":
            return None
        cores = self.cores if self.cores is not None else usable_cores()
        return cores if cores < self.devices_per_node else None

    @property
    def nodes(self) -> int:
        return -(-self.devices // self.devices_per_node)

    def node_of(self, device_id: int) -> int:
        return device_id // self.devices_per_node

    def spans_nodes(self, device_ids: tuple[int, ...] | list[int]) -> bool:
        return len({self.node_of(d) for d in device_ids}) > 1

    def with_overrides(
        self,
        *,
        devices: int | None = None,
        devices_per_node: int | None = None,
        device: str | None = None,
        peak_flops: float | None = None,
        memory_bytes: int | None = None,
        intra_bandwidth: float | None = None,
        inter_bandwidth: float | None = None,
        cores: int | None = None,
    ) -> Cluster:
        """Apply command-line overrides on top of what the spec said."""
        dev = preset(device) if device is not None else self.device
        changes = {
            k: v
            for k, v in (
                ("peak_flops", peak_flops),
                ("memory_bytes", memory_bytes),
                ("intra_bandwidth", intra_bandwidth),
                ("inter_bandwidth", inter_bandwidth),
            )
            if v is not None
        }
        if changes:
            dev = replace(dev, **changes)
        n = devices if devices is not None else self.devices
        per_node = devices_per_node if devices_per_node is not None else self.devices_per_node
        return Cluster(
            devices=n,
            devices_per_node=min(per_node, n),
            device=dev,
            cores=cores if cores is not None else self.cores,
        )


DEFAULT_CLUSTER = Cluster(devices=8, devices_per_node=8, device=PRESETS["a100-80gb"])
