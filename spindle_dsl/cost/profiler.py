"""Measure the real layers: one layer's forward+backward of each MetaOp shape at several
per-device batch sizes, then fit the piecewise alpha-beta model to the timings.

The batch sizes are the ones the planner will ask about: ``ceil(batch / n)`` for n from 1 to
the cluster size, thinned to a few points spread evenly on a log scale (always including the
smallest and the largest), so the fit interpolates rather than extrapolates. Each point is
timed until it has both a minimum number of repeats and a minimum of wall time, after warm-up,
and the median is kept: the median shrugs off the bursts of a shared machine.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spindle_dsl.cost import comm
from spindle_dsl.cost.analytic import backward_multiplier
from spindle_dsl.cost.fit import fit_piecewise
from spindle_dsl.cost.profile import Mode, Profile, ProfileEntry, Sample, mode_of, shape_key
from spindle_dsl.errors import SpindleError
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph, MetaOp

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TimingBudget:
    """How hard to time each point (defaults keep tiny_mm well under a minute on a CPU)."""

    warmup: int = 2
    min_repeats: int = 5
    max_repeats: int = 50
    min_seconds: float = 0.15


def planned_batches(batch: int, devices: int, points: int = 5) -> tuple[int, ...]:
    """Per-device batches to measure: up to ``points`` values of ceil(batch / n), log-spread."""
    needed = sorted({comm.ceil_div(batch, n) for n in range(1, devices + 1)} - {0})
    if len(needed) <= points:
        return tuple(needed)
    lo, hi = math.log(needed[0]), math.log(needed[-1])
    chosen = set()
    for i in range(points):
        target = math.exp(lo + (hi - lo) * i / (points - 1))
        chosen.add(min(needed, key=lambda b: abs(math.log(b) - math.log(target))))
    return tuple(sorted(chosen))


def time_layer(
    kind_name: str,
    args: dict,
    tokens: int,
    mode: Mode,
    batch: int,
    *,
    device: str = "cpu",
    budget: TimingBudget = TimingBudget(),
) -> float:
    """Median seconds of one layer forward (+ backward unless ``mode == "forward"``)."""
    import torch

    kind = get_kind(kind_name)
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    layer = kind.build_layer(args).to(device=dev, dtype=dtype)
    if mode != "train":
        layer.requires_grad_(False)
    x = torch.randn(batch, tokens, kind.in_width(args), device=dev, dtype=dtype)
    x.requires_grad_(mode != "forward")

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def step() -> float:
        sync()
        start = time.perf_counter()
        if mode == "forward":
            with torch.no_grad():
                layer(x)
        else:
            out = layer(x)
            out.backward(torch.ones_like(out))
        sync()
        return time.perf_counter() - start

    for _ in range(budget.warmup):
        step()
    times: list[float] = []
    while len(times) < budget.max_repeats and (
        len(times) < budget.min_repeats or sum(times) < budget.min_seconds
    ):
        times.append(step())
    return statistics.median(times)


def profile_graph(
    graph: MetaGraph,
    *,
    device: str = "cpu",
    threads: int | None = 1,
    points: int = 5,
    budget: TimingBudget = TimingBudget(),
    progress: Progress | None = None,
) -> Profile:
    """Time every distinct MetaOp shape of ``graph`` and fit its curve."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SpindleError("--device cuda: no CUDA device is available here (try --device cpu)")
    if device not in ("cpu", "cuda"):
        raise SpindleError(f"unknown profiling device '{device}' (use cpu or cuda)")
    if threads is not None:
        torch.set_num_threads(threads)
    groups: dict[tuple, list[MetaOp]] = {}
    for op in graph.metaops:
        groups.setdefault(shape_key(op), []).append(op)
    entries = []
    for i, ops in enumerate(groups.values(), start=1):
        entries.append(_profile_shape(ops, graph, device, points, budget, progress, i, len(groups)))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return Profile(
        device=device,
        device_name=name,
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        dtype="bfloat16" if device == "cuda" else "float32",
        spec=graph.spec_path,
        entries=tuple(entries),
    )


def _profile_shape(
    ops: Sequence[MetaOp],
    graph: MetaGraph,
    device: str,
    points: int,
    budget: TimingBudget,
    progress: Progress | None,
    index: int,
    total: int,
) -> ProfileEntry:
    op = ops[0]
    args = dict(op.args)
    mode = mode_of(op)
    per_sample = backward_multiplier(op) * get_kind(op.kind).forward_flops(args, op.tokens)
    largest = max(max(o.batch for o in ops), 1)  # a task the mix leaves out still gets a curve
    batches = planned_batches(largest, graph.cluster.devices, points)
    samples = []
    for b in batches:
        seconds = time_layer(op.kind, args, op.tokens, mode, b, device=device, budget=budget)
        samples.append(Sample(b, per_sample * b, seconds))
        if progress:
            progress(
                f"[{index}/{total}] {op.id} ({op.kind}, {op.tokens} tokens, {mode}): "
                f"batch {b}: {seconds * 1e3:.3f} ms"
            )
    fit = fit_piecewise([(s.flops, s.seconds) for s in samples])
    return ProfileEntry(
        kind=op.kind,
        args=tuple(sorted(op.args)),
        tokens=op.tokens,
        mode=mode,
        metaops=tuple(o.id for o in ops),
        samples=tuple(samples),
        fit=fit,
    )
