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
from typing import Any

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost import comm
from spindle_dsl.cost.analytic import backward_multiplier, tp_degrees
from spindle_dsl.cost.fit import fit_piecewise
from spindle_dsl.cost.profile import (
    Mode,
    Profile,
    ProfileEntry,
    Sample,
    first_input_needs_no_gradient,
    mode_of,
    shape_key,
)
from spindle_dsl.errors import SpindleError
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph, MetaOp

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TimingBudget:
    """How hard to time each point (defaults keep tiny_mm well under a minute on a CPU), and
    what to keep of the repeats: the median (the layer's own speed: a shared machine's bursts
    fall outside it), or the mean (what a run gets on the machine as it is: a stage of a run
    lasts many repeats' time and pays for every time slice other processes take, which a
    median of short repeats would skip; ``spindle profile --nproc`` keeps the mean)."""

    warmup: int = 2
    min_repeats: int = 5
    max_repeats: int = 50
    min_seconds: float = 0.15
    statistic: str = "median"  # or "mean"

    def summary(self, times: Sequence[float]) -> float:
        return statistics.fmean(times) if self.statistic == "mean" else statistics.median(times)


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


def layer_runner(
    kind_name: str,
    args: dict,
    tokens: int,
    mode: Mode,
    batch: int,
    *,
    device: str = "cpu",
    input_grad: bool | None = None,
    wrap: Callable[[Any], Any] | None = None,
) -> Callable[[], float]:
    """One layer of this shape built with its input, as a function that runs it once, forward
    (+ backward unless ``mode == "forward"``), and returns the seconds it took. The input
    needs a gradient unless ``mode == "forward"`` or ``input_grad`` is False (a layer whose
    input comes from frozen towers: its backward then skips its first matmul's input
    gradient). ``wrap`` runs the built layer through another module (a rank's
    tensor-parallel view of it)."""
    import torch

    kind = get_kind(kind_name)
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    layer = kind.build_layer(args).to(device=dev, dtype=dtype)
    if mode != "train":
        layer.requires_grad_(False)
    if wrap is not None:
        layer = wrap(layer)
    # the layers work at the tokens the input stage makes (a CLS token more, a stem's fewer)
    inner = kind.layer_tokens(args, tokens)
    x = torch.randn(batch, inner, kind.in_width(args), device=dev, dtype=dtype)
    x.requires_grad_(mode != "forward" if input_grad is None else input_grad)

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

    return step


def time_layer(step: Callable[[], float], budget: TimingBudget = TimingBudget()) -> float:
    """Seconds of one ``layer_runner`` step, warmed up, repeated and summarised as ``budget``
    says (one burst: ``time_interleaved`` with a single round)."""
    return time_interleaved([step], budget, rounds=1)[0]


def time_interleaved(
    steps: Sequence[Callable[[], float]],
    budget: TimingBudget,
    rounds: int,
    before_each: Callable[[int], None] = lambda _i: None,
) -> list[float]:
    """Each of ``steps`` timed in ``rounds`` turns (``turn_times``), summarised as ``budget``
    says."""
    turns = turn_times(steps, budget, rounds, before_each)
    return [budget.summary([t for turn in point for t in turn]) for point in turns]


def turn_times(
    steps: Sequence[Callable[[], float]],
    budget: TimingBudget,
    rounds: int,
    before_each: Callable[[int], None] = lambda _i: None,
) -> list[list[list[float]]]:
    """Each of ``steps`` timed in ``rounds`` turns, one after another in every round: a
    machine whose speed drifts over seconds then slows every point alike, so the points keep
    their ratios (timed one after the other, each in its own burst, two shapes a planner
    balances against each other could be measured in a fast and a slow second, far apart on
    a shared machine). ``budget``'s repeats and seconds are the totals per step, spread over
    the rounds; ``before_each(i)`` runs before step i's turn (the workers line up there).
    Returns every step's repeats, turn by turn."""
    rounds = max(1, rounds)
    per_round = max(1, math.ceil(budget.min_repeats / rounds))
    most = max(per_round, math.ceil(budget.max_repeats / rounds))
    seconds = budget.min_seconds / rounds
    times: list[list[list[float]]] = [[] for _ in steps]
    for r in range(rounds):
        for i, step in enumerate(steps):
            before_each(i)
            for _ in range(budget.warmup if r == 0 else 1):
                step()
            mine: list[float] = []
            while len(mine) < most and (len(mine) < per_round or sum(mine) < seconds):
                mine.append(step())
            times[i].append(mine)
    return times


def rank_jitter(turns_by_rank: Sequence[Sequence[Sequence[float]]]) -> float:
    """How far one rank's turn strays from the others' running the same turn side by side, as
    a fraction of the turn (``turns_by_rank[rank][turn]``: a turn's seconds per repeat): the
    part of the machine's noise the ranks do not share. Each rank's turn time is compared with
    the ranks' mean for that turn, and the spread of those deviations is read robustly (1.4826
    median absolute deviations, a normal's standard deviation): a run is judged by its median
    step, which a rank descheduled for a whole second does not move, so neither may a turn in
    which that happened. 0 with fewer than two ranks."""
    ranks = [r for r in turns_by_rank if r]
    if len(ranks) < 2:
        return 0.0
    n = len(ranks)
    deviations = []
    for turn in zip(*ranks, strict=False):
        means = [statistics.fmean(t) for t in turn if t]
        if len(means) != n:
            continue
        mid = statistics.fmean(means)
        if mid > 0:
            deviations.extend(abs(m / mid - 1.0) for m in means)
    if not deviations:
        return 0.0
    # a deviation from the turn's own mean has variance (n - 1) / n of a rank's own
    return 1.4826 * statistics.median(deviations) * math.sqrt(n / (n - 1))


def shape_groups(graph: MetaGraph) -> list[list[MetaOp]]:
    """The graph's MetaOps grouped by what determines a layer's time (``shape_key``), in
    order of first appearance: one profile entry per group."""
    groups: dict[tuple, list[MetaOp]] = {}
    for op in graph.metaops:
        groups.setdefault(shape_key(op), []).append(op)
    return list(groups.values())


def shape_batches(ops: Sequence[MetaOp], devices: int, points: int) -> tuple[int, ...]:
    """The per-device batches to time a shape at: those its MetaOps meet on up to ``devices``
    devices (a task the mix leaves out still gets a curve)."""
    largest = max(max(o.batch for o in ops), 1)
    return planned_batches(largest, devices, points)


def measured_tp_degrees(op: MetaOp, cluster: Cluster, side_by_side: int) -> tuple[int, ...]:
    """The tensor-parallel degrees a profile times ``op``'s shape at: those the runtime can
    split it into (``tp_degrees``) with a group small enough for ``side_by_side``, the ranks
    that compute at once without taking turns on a core (a larger group would time the OS's
    time-slicing, which the step model prices per wave)."""
    return tuple(k for k in tp_degrees(op, cluster)[1:] if k <= side_by_side)


def tp_batches(ops: Sequence[MetaOp], devices: int, tp: int, points: int) -> tuple[int, ...]:
    """The rows per ``tp``-way group to time a shape at: those its MetaOps meet with a
    data-parallel degree of up to ``devices // tp``."""
    return shape_batches(ops, max(devices // tp, 1), points)


def per_sample_flops(op: MetaOp) -> float:
    """Forward+backward FLOPs of one layer of ``op`` for one sample."""
    return backward_multiplier(op) * get_kind(op.kind).forward_flops(dict(op.args), op.tokens)


def needs_first_layer_ratio(graph: MetaGraph, ops: Sequence[MetaOp]) -> bool:
    """Whether a shape group's entry needs ``first_layer_ratio``: some MetaOp of it trains
    with a first layer whose input needs no gradient."""
    return any(first_input_needs_no_gradient(graph, op) for op in ops)


def first_layer_ratio(
    op: MetaOp, batch: int, budget: TimingBudget, device: str = "cpu", rounds: int = 3
) -> float:
    """One layer of ``op``'s shape at ``batch`` with an input that needs no gradient, over the
    same layer with one that does (``ProfileEntry.first_layer_ratio``): the two timed in
    ``rounds`` turns, so that a drift slows both alike; at most 1 (skipping work cannot cost
    more; above 1 is noise)."""
    args = dict(op.args)
    full = layer_runner(op.kind, args, op.tokens, "train", batch, device=device)
    weights_only = layer_runner(
        op.kind, args, op.tokens, "train", batch, device=device, input_grad=False
    )
    t_full, t_weights = time_interleaved([full, weights_only], budget, rounds)
    return min(1.0, t_weights / t_full) if t_full > 0 else 1.0


def shape_entry(
    ops: Sequence[MetaOp],
    timings: Sequence[tuple[int, float]],
    first_layer_ratio: float | None = None,
    tp: int = 1,
) -> ProfileEntry:
    """A profile entry from (per-device batch, seconds) timings of the shape; with ``tp``,
    (rows per group, seconds) timings of its ``tp``-way layer, each device doing a ``tp``-th
    of the rows' work."""
    op = ops[0]
    per_sample = per_sample_flops(op) / tp
    samples = tuple(Sample(b, per_sample * b, t) for b, t in timings)
    return ProfileEntry(
        kind=op.kind,
        args=tuple(sorted(op.args)),
        tokens=op.tokens,
        mode=mode_of(op),
        metaops=tuple(o.id for o in ops),
        samples=samples,
        fit=fit_piecewise([(s.flops, s.seconds) for s in samples]),
        first_layer_ratio=first_layer_ratio,
        tp=tp,
    )


def check_device(device: str) -> None:
    import torch

    if device not in ("cpu", "cuda"):
        raise SpindleError(f"unknown profiling device '{device}' (use cpu or cuda)")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpindleError("--device cuda: no CUDA device is available here (try --device cpu)")


def profile_graph(
    graph: MetaGraph,
    *,
    device: str = "cpu",
    threads: int | None = 1,
    points: int = 5,
    budget: TimingBudget = TimingBudget(),
    progress: Progress | None = None,
) -> Profile:
    """Time every distinct MetaOp shape of ``graph`` in this process and fit its curve (no
    process group: the step's other costs keep their analytic figures; ``spindle profile
    --nproc N`` measures them on the backend's workers, ``backends.torch.profiling``)."""
    import torch

    check_device(device)
    if threads is not None:
        torch.set_num_threads(threads)
    groups = shape_groups(graph)
    entries = []
    for i, ops in enumerate(groups, start=1):
        op = ops[0]
        timings = []
        for b in shape_batches(ops, graph.cluster.devices, points):
            step = layer_runner(op.kind, dict(op.args), op.tokens, mode_of(op), b, device=device)
            seconds = time_layer(step, budget)
            timings.append((b, seconds))
            if progress:
                progress(
                    f"[{i}/{len(groups)}] {op.id} ({op.kind}, {op.tokens} tokens, "
                    f"{mode_of(op)}): batch {b}: {seconds * 1e3:.3f} ms"
                )
        ratio = None
        if needs_first_layer_ratio(graph, ops):
            ratio = first_layer_ratio(op, timings[-1][0], budget, device)
            if progress:
                progress(
                    f"[{i}/{len(groups)}] {op.id}: a first layer whose input needs no "
                    f"gradient takes {ratio:.3f} of the layer"
                )
        entries.append(shape_entry(ops, timings, ratio))
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
