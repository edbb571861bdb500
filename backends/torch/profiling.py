"""``spindle profile --nproc N``: the step model's figures, measured on the backend's workers.

The profile is made where a run happens: ``--nproc N`` spawns N worker processes with the
launcher a run uses (``launch.spawn``: the same environment, the same torch thread setting per
worker, gloo on CPU and NCCL on GPUs), and every rank takes part in every measurement
(``measure``). Measured, in order: each MetaOp shape's layer at several per-device batches (the
compute curves, fitted piecewise as the paper does), with more ranks than cores what taking
turns on them costs beyond the fair share (``measure.sharing_slowdown``), each input stage and
loss head per sample, the collectives the gradient reduction issues (all-reduce,
reduce-scatter, all-gather) over every group size up to N, point-to-point exchange, the
optimizer per parameter byte, the flat-buffer copies, and the fixed cost of a stage. Rank 0
fits the lines and returns the ``Profile`` (``cost.profile``); the value and its fits live in
``spindle_dsl.cost`` and never import the backend.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch
import torch.distributed as dist

from spindle_dsl.cluster import usable_cores
from spindle_dsl.cost.fit import fit_line
from spindle_dsl.cost.overheads import (
    Collective,
    Line,
    StepOverheads,
    analytic_overheads,
)
from spindle_dsl.cost.profile import (
    Profile,
    ProfileEntry,
    data_parallel_rate,
    mode_of,
    shape_key,
)
from spindle_dsl.cost.profile_needs import ProfileSelection, part_classes
from spindle_dsl.cost.profiler import (
    TimingBudget,
    measured_tp_degrees,
    needs_first_layer_ratio,
    per_sample_flops,
    shape_batches,
    shape_entry,
    shape_groups,
    tp_batches,
)
from spindle_dsl.cost.step_parts import op_steps, sink_losses
from spindle_dsl.metagraph import MetaGraph

from ..base import DeviceKind, RunConfig
from . import measure as M
from .allocator import keep_freed_host_memory
from .data import TaskData
from .worker import init_distributed

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
MAX_COMM_BYTES = 1 << 26  # 64 MiB: larger buffers add time, not information (lines are lines)


@dataclass(frozen=True)
class ProfileSettings:
    """How to profile (pickled to the workers; ``collective_timeout_s`` as ``RunConfig``)."""

    device: DeviceKind = "auto"
    points: int = 5  # batch sizes (and message sizes) per fitted line
    budget: TimingBudget = field(default_factory=lambda: TimingBudget(statistic="mean"))
    progress: bool = True  # a progress bar on rank 0
    # only these terms (what the profile cache lacks, ``cost.profile_needs``); None: all
    only: ProfileSelection | None = None
    collective_timeout_s: float = 300.0
    hang_timeout_s: float = 120.0  # no heartbeat for this long: a rank is hung


@dataclass(frozen=True)
class ProfileJob:
    """The job ``launch.spawn`` hands every worker (it calls ``run_rank``)."""

    graph: MetaGraph
    config: ProfileSettings

    def run_rank(
        self,
        rank: int,
        world: int,
        local_rank: int,
        *,
        store: Any = None,
        heartbeat: Callable[[str], None] | None = None,
    ) -> Profile | None:
        return measure_profile(self.graph, self.config, rank, world, local_rank, store, heartbeat)


def profile_on_workers(graph: MetaGraph, nproc: int, settings: ProfileSettings) -> Profile:
    """Spawn ``nproc`` local workers, profile on them, and return rank 0's profile."""
    from .launch import spawn

    return spawn(ProfileJob(graph, settings), nproc, hang_timeout_s=settings.hang_timeout_s)


class Bar:
    """A progress bar on a terminal, a line per item elsewhere (CI logs, pipes)."""

    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None):
        self.total, self.done, self.enabled = max(total, 1), 0, enabled
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 24
        fill = width * self.done // self.total
        line = f"profile [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total}  {label}"
        self.stream.write(("\r\x1b[2K" + line) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def measure_profile(
    graph: MetaGraph,
    settings: ProfileSettings,
    rank: int,
    world: int,
    local_rank: int = 0,
    store: Any = None,
    heartbeat: Callable[[str], None] | None = None,
) -> Profile | None:
    """Profile ``graph`` on this rank of ``world`` (a collective); rank 0 gets the profile."""
    beat = heartbeat or (lambda _what: None)
    keep_freed_host_memory()  # allocate as the run will (``allocator``)
    beat("joining the process group")
    run = RunConfig(
        steps=0, device=settings.device, collective_timeout_s=settings.collective_timeout_s
    )
    backend, device, created = init_distributed(run, rank, world, local_rank, store)
    try:
        return _measure(graph, settings, rank, world, backend, device, beat)
    finally:
        if created:
            dist.destroy_process_group()


@dataclass(frozen=True)
class _Plan:
    """What one profiling run measures (every rank computes the same)."""

    groups: list  # MetaOp shape groups
    layer_points: list  # (shape group, per-device batch)
    first_layers: list  # (shape group index, per-device batch): its ``first_layer_ratio``
    tp_points: list  # (shape group, tensor-parallel degree, rows per group)
    stages: dict  # input key -> (op, modality, tokens)
    sinks: dict  # loss key -> SinkLoss
    comm_sizes: tuple[int, ...]
    p2p_sizes: tuple[int, ...]
    opt_sizes: tuple[int, ...]
    part_keys: dict  # part class -> a part of that class
    group_sizes: tuple[int, ...]
    machine: bool  # the terms every spec shares: collectives, exchange, stage, sharing

    @classmethod
    def of(
        cls,
        graph: MetaGraph,
        world: int,
        active: int,
        points: int,
        only: ProfileSelection | None = None,
    ) -> _Plan:
        """Everything ``graph``'s step is priced with, or only what ``only`` selects."""
        devices = graph.cluster.devices

        def wanted(ops: list, tp: int = 1) -> bool:
            return only is None or shape_key(ops[0], tp) in only.shapes

        groups = [g for g in shape_groups(graph) if wanted(g)]
        tp_shapes = [
            (ops, k)
            for ops in shape_groups(graph)
            for k in measured_tp_degrees(ops[0], graph.cluster, active)
            if wanted(ops, k)
        ]
        stages: dict[str, tuple] = {}
        steps = op_steps(graph)
        for op in graph.metaops:
            modal = [i for i in op.inputs if i.from_modality]
            for inp, stage in zip(modal, steps[op.id].inputs, strict=True):
                if op.batch > 0 and (only is None or stage.key in only.inputs):
                    stages.setdefault(stage.key, (op, inp.source, inp.tokens))
        total = _trainable_bytes(graph)
        machine = only is None or only.machine
        sinks = {s.key: s for s in sink_losses(graph) if only is None or s.key in only.losses}
        parts = {c: k for c, k in part_classes(graph).items() if only is None or c in only.parts}
        return cls(
            groups=groups,
            layer_points=[(ops, b) for ops in groups for b in shape_batches(ops, devices, points)],
            first_layers=[
                (i, shape_batches(ops, devices, points)[-1])
                for i, ops in enumerate(groups)
                if needs_first_layer_ratio(graph, ops)
            ],
            tp_points=[
                (ops, k, b) for ops, k in tp_shapes for b in tp_batches(ops, devices, k, points)
            ],
            stages=stages,
            sinks=sinks,
            comm_sizes=M.log_sizes(4096, min(total, MAX_COMM_BYTES), points) if machine else (),
            p2p_sizes=(
                M.log_sizes(1024, min(_largest_activation(graph), MAX_COMM_BYTES), points)
                if machine
                else ()
            ),
            opt_sizes=M.log_sizes(1 << 16, min(total, MAX_COMM_BYTES), points),
            part_keys=parts,
            group_sizes=tuple(range(2, world + 1)) if machine else (),
            machine=machine,
        )

    def items(self, points: int) -> int:
        """Timing points in all, for the progress bar."""
        return (
            (len(self.layer_points) + len(self.tp_points)) * M.LAYER_ROUNDS
            + len(self.first_layers)
            + points * (len(self.stages) + len(self.sinks))
            + len(COLLECTIVES) * len(self.group_sizes) * len(self.comm_sizes)
            + (len(self.p2p_sizes) if self.group_sizes else 0)
            + len(self.opt_sizes)
            + len(self.part_keys)
            + (2 if self.machine else 1)
        )


def _measure(
    graph: MetaGraph,
    settings: ProfileSettings,
    rank: int,
    world: int,
    backend: str,
    device: torch.device,
    beat: Callable[[str], None],
) -> Profile | None:
    cuda = device.type == "cuda"
    cores = None if cuda else usable_cores()
    active = world if cores is None else max(1, min(world, cores))
    dtype = torch.bfloat16 if cuda else torch.float32
    probe = M.Probe(rank, world, active, device, dtype, settings.budget, beat)
    todo = _Plan.of(graph, world, active, settings.points, settings.only)
    sharing = 1 if world > active and todo.machine else 0  # the taking-turns point
    bar = Bar(todo.items(settings.points) + sharing, rank == 0 and settings.progress)
    try:
        entries, jitter = _layers(probe, todo, bar)
        slowdown = _sharing(probe, todo, bar) if todo.machine else 1.0
        data = TaskData(graph, 0, None, dtype, device)
        inputs, losses = _inputs_and_losses(probe, graph, data, todo, settings.points, bar)
        comm = _communication(probe, graph, todo, bar)
        optimizer = _optimizer(probe, graph, todo, bar)
        stage = M.stage_seconds(probe) if todo.machine else 0.0
        if todo.machine:
            bar.step("stage bookkeeping")
    finally:
        bar.close()
    if rank != 0:
        return None
    overheads = StepOverheads(
        source="profile",
        **comm,
        **optimizer,
        wave_s=stage or 0.0,
        seconds_per_flop=data_parallel_rate(entries) or 0.0,
        inputs=inputs,
        losses=losses,
        cores=cores,
        sharing_slowdown=slowdown or 1.0,
        rank_jitter=jitter,
    )
    return Profile(
        device=device.type,
        device_name=torch.cuda.get_device_name(device) if cuda else "cpu",
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        dtype=str(dtype).removeprefix("torch."),
        spec=graph.spec_path,
        entries=entries,
        nproc=world,
        backend=backend,
        overheads=overheads,
    )


def _layers(probe: M.Probe, todo: _Plan, bar: Bar) -> tuple[tuple[ProfileEntry, ...], float]:
    """Every layer shape at every per-device batch, timed in turns and fitted, and how far the
    ranks' turns strayed from each other (on rank 0)."""
    points = [(ops[0], mode_of(ops[0]), b) for ops, b in todo.layer_points]
    seconds, jitter = M.layers_seconds(probe, points, bar.step)
    ratios: dict[int, float | None] = {}
    for group, b in todo.first_layers:
        ratios[group] = M.first_layer_ratio(probe, todo.groups[group][0], b)
        bar.step(f"{todo.groups[group][0].id}: first layer without an input gradient")
    tp_seconds = M.tp_layers_seconds(
        probe, [(ops[0], mode_of(ops[0]), k, b) for ops, k, b in todo.tp_points], bar.step
    )
    if probe.rank != 0:
        return (), 0.0
    timings: list[list[tuple[int, float]]] = [[] for _ in todo.groups]
    for (ops, b), t in zip(todo.layer_points, seconds, strict=True):
        if t is not None:
            timings[todo.groups.index(ops)].append((b, t))
    entries = tuple(
        shape_entry(ops, t, ratios.get(i))
        for i, (ops, t) in enumerate(zip(todo.groups, timings, strict=True))
    )
    return entries + _tp_entries(todo.tp_points, tp_seconds), jitter


def _tp_entries(points: list, seconds: list[float | None]) -> tuple[ProfileEntry, ...]:
    """An entry per (shape group, degree) of the tensor-parallel points that were timed."""
    timings: dict[tuple[int, int], tuple[list, list[tuple[int, float]]]] = {}
    for (ops, k, rows), t in zip(points, seconds, strict=True):
        timed = timings.setdefault((id(ops), k), (ops, []))[1]
        if t is not None:
            timed.append((rows, t))
    return tuple(shape_entry(ops, t, tp=k) for (_, k), (ops, t) in timings.items() if t)


def _sharing(probe: M.Probe, todo: _Plan, bar: Bar) -> float | None:
    """With more ranks than cores, the measured cost of taking turns (``sharing_slowdown``),
    on the layer point with the most work (what dominates a step); 1.0 otherwise."""
    if probe.world <= probe.active or not todo.layer_points:
        return 1.0
    ops, b = max(todo.layer_points, key=lambda p: per_sample_flops(p[0][0]) * p[1])
    slowdown = M.sharing_slowdown(probe, ops[0], mode_of(ops[0]), b)
    bar.step(f"{probe.world} ranks taking turns on {probe.active} cores")
    return slowdown


def _inputs_and_losses(
    probe: M.Probe, graph: MetaGraph, data: TaskData, todo: _Plan, points: int, bar: Bar
) -> tuple[tuple[tuple[str, Line], ...], tuple[tuple[str, Line], ...]]:
    """Per-sample lines of every input stage and every loss head."""
    devices = graph.cluster.devices
    inputs = []
    for key, (op, modality, tokens) in todo.stages.items():
        pts = []
        for b in M.batches_for(op.batch, devices, points)[:points]:
            pts.append((b, M.input_stage_seconds(probe, graph, data, op, modality, tokens, b)))
            bar.step(f"input {op.id}:{modality} batch {b}")
        bar.done += points - len(pts)
        inputs.append((key, _line(pts)))
    losses = []
    for key, sink in todo.sinks.items():
        pts = []
        for b in M.batches_for(graph.op(sink.sink).batch, devices, points)[:points]:
            pts.append((b, M.loss_seconds(probe, graph, data, sink, b)))
            bar.step(f"loss {sink.task} batch {b}")
        bar.done += points - len(pts)
        losses.append((key, _line(pts)))
    return tuple(inputs), tuple(losses)


def _communication(probe: M.Probe, graph: MetaGraph, todo: _Plan, bar: Bar) -> dict[str, Any]:
    """The collectives over every group size, and the exchange; one process has no one to
    talk to, so its communication keeps the analytic figures."""
    fits: dict[str, list[tuple[int, Line]]] = {k: [] for k in COLLECTIVES}
    for g in todo.group_sizes:
        ranks = list(range(g))
        group = None if g == probe.world else dist.new_group(ranks)
        for kind in COLLECTIVES:
            pts = []
            for nbytes in todo.comm_sizes:
                pts.append((nbytes, M.collective_seconds(probe, kind, nbytes, ranks, group)))
                bar.step(f"{kind} on {g} ranks, {nbytes} bytes")
            fits[kind].append((g, _line(pts)))
    if probe.world < 2:
        o = analytic_overheads(graph.cluster)
        return {"all_reduce": o.all_reduce, "reduce_scatter": o.reduce_scatter,
                "all_gather": o.all_gather, "p2p": o.p2p}  # fmt: skip
    pts = []
    for nbytes in todo.p2p_sizes:
        pts.append((nbytes, M.exchange_seconds(probe, nbytes)))
        bar.step(f"exchange {nbytes} bytes")
    out: dict[str, Any] = {k: Collective(tuple(v)) for k, v in fits.items()}
    return {**out, "p2p": _line(pts)}


def _optimizer(probe: M.Probe, graph: MetaGraph, todo: _Plan, bar: Bar) -> dict[str, Any]:
    """AdamW per byte, the flat-buffer copies, and the per-part work of every part class."""
    pts = []
    for nbytes in todo.opt_sizes:
        pts.append((nbytes, M.optimizer_seconds(probe, nbytes)))
        bar.step(f"optimizer {nbytes} bytes")
    big = todo.opt_sizes[-1]
    copy = M.copy_seconds(probe, big)
    bar.step("copies")
    line = _line(pts)
    parts, alone = [], []
    for cls, key in todo.part_keys.items():
        t = M.part_seconds(probe, graph, key)
        if t is not None:
            parts.append((cls, t))
        got = M.part_alone_seconds(probe, graph, key)
        if got is not None:  # what the part's tensors cost beyond AdamW's line at its bytes
            seconds, nbytes = got
            alone.append((cls, max(seconds - line.at(nbytes), 0.0)))
        bar.step(f"optimizer work of {cls}")
    return {
        "optimizer": line,
        "copy_s_per_byte": (copy or 0.0) / big,
        "parts": tuple(parts),
        "parts_alone": tuple(alone),
    }


def _line(points: list[tuple[int, float | None]]) -> Line:
    """The alpha-beta line through rank 0's points (a flat zero when nothing was timed)."""
    pts = [(float(x), t) for x, t in points if t is not None and t > 0]
    if not pts:
        return Line(0.0, 0.0)
    return Line(*fit_line(pts))


def _trainable_bytes(graph: MetaGraph) -> int:
    """Gradient bytes of every trainable part the graph runs (each part once)."""
    seen: dict[str, float] = {}
    for op in op_steps(graph).values():
        seen.update(op.layer_parts)
        seen.update((s.part, s.grad_bytes) for s in op.inputs)
    seen.update((s.head_part, s.head_bytes) for s in sink_losses(graph) if s.head_part)
    return max(int(sum(seen.values())), 4096)


def _largest_activation(graph: MetaGraph) -> int:
    """Bytes of the largest activation any MetaOp hands on (its whole batch)."""
    sizes = [m.batch * m.out_tokens * m.out_width * graph.dtype_bytes for m in graph.metaops]
    return max([*sizes, 4096])
