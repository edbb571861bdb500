"""The measurements behind ``spindle profile --nproc N``, each run on every rank at once.

Every function here is a collective: all ranks call it with the same arguments, and it returns
what it measured on rank 0 (None elsewhere). Each timing point starts with a barrier, so the
ranks that measure compute do so side by side, contending for memory bandwidth and caches as
the workers of a run do. Compute is timed on ``active`` ranks only, as many as the machine has
cores (the rest wait in the barrier, asleep): timing more processes than cores would measure
the OS time-slicing, which the step model prices per wave instead (``cost.step``). Collectives
and point-to-point exchange run on all the ranks they involve, as in a run. Times are means of
repeats (``time_repeats``, ``ProfileSettings.budget``): a run's stages pay for whatever time
other processes take of the cores, so the profile does too.

The inputs and losses are timed with the runtime's own code: ``TaskData`` reads the batch
(synthetic data is generated per sample, a real cost), ``build_part`` builds the input stage or
the LM head exactly as a rank does, and ``losses`` computes the loss as the executor does.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from spindle_dsl.cost import profiler as P
from spindle_dsl.cost.profiler import (
    TimingBudget,
    layer_runner,
    planned_batches,
    rank_jitter,
    time_interleaved,
    turn_times,
)
from spindle_dsl.cost.step_parts import SinkLoss
from spindle_dsl.metagraph import MetaGraph, MetaOp

from . import losses as L
from .data import TaskData
from .grads import _reduce_scatter
from .optim import adamw_step
from .params import build_part
from .parts import Part
from .tensor_parallel import ShardView, tp_groups
from .zero import _all_gather, state_dtype

Beat = Callable[[str], None]
# Every rank of a collective must run it as often as the others: a fixed count, never "until
# enough time has passed", which each rank would judge by its own clock. The median: a
# collective's time includes the skew with which the ranks leave the barrier before it, and
# one rank descheduled at that moment moves a mean of a few repeats far more than what a
# run's step pays for it (fitted from such means, the same 2-rank reduce-scatter's latency can
# differ severalfold between profiles a minute apart).
COMM_BUDGET = TimingBudget(
    warmup=1, min_repeats=11, max_repeats=11, min_seconds=0.0, statistic="median"
)


def time_repeats(step: Callable[[], None], budget: TimingBudget, sync: Callable[[], None]) -> float:
    """Seconds of ``step`` after warm-up, repeated and summarised as ``budget`` says (one
    round of ``time_interleaved``, each repeat between two ``sync`` calls)."""

    def timed() -> float:
        sync()
        start = time.perf_counter()
        step()
        sync()
        return time.perf_counter() - start

    return time_interleaved([timed], budget, rounds=1)[0]


def _gather_mean(value: float | None, rank: int, world: int) -> float | None:
    """Rank 0 gets the mean of the values the ranks that measured sent (None elsewhere)."""
    got: list[float | None] = [None] * world if rank == 0 else []
    dist.gather_object(value, got if rank == 0 else None, dst=0)
    if rank != 0:
        return None
    vals = [v for v in got if v is not None]
    return sum(vals) / len(vals) if vals else None


class Probe:
    """What every measurement needs: who this rank is, where and how to time, and whom to
    tell (heartbeat) that it is alive."""

    def __init__(
        self,
        rank: int,
        world: int,
        active: int,
        device: torch.device,
        dtype: torch.dtype,
        budget: TimingBudget,
        beat: Beat,
    ):
        self.rank, self.world, self.active = rank, world, active
        self.device, self.dtype, self.budget, self.beat = device, dtype, budget, beat

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def compute(self, what: str, step: Callable[[], None] | None) -> float | None:
        """Time ``step`` on the active ranks side by side; rank 0 gets their mean."""
        self.beat(what)
        dist.barrier()
        mine = None
        if self.rank < self.active and step is not None:
            mine = time_repeats(step, self.budget, self.sync)
        return _gather_mean(mine, self.rank, self.world)


# --- layers, input stages, losses -----------------------------------------------------------


# Turns each layer point gets (``layers_seconds``): enough that a second or two of a slow machine
# falls on several points' turns alike, few enough that the barriers before each turn cost
# nothing next to the points' own time.
LAYER_ROUNDS = 5


def layers_seconds(
    probe: Probe,
    points: Sequence[tuple[MetaOp, str, int]],
    on_turn: Callable[[str], None] = lambda _label: None,
) -> tuple[list[float | None], float]:
    """Every (op, mode, per-device batch) layer point, timed in turns (``turn_times``) on the
    active ranks side by side (a barrier before every turn; ``on_turn`` hears of each). Rank 0
    gets each point's mean over the ranks and how far the ranks' turns strayed from each
    other (``rank_jitter``); the other ranks get Nones and 0."""
    where = str(probe.device)
    runners = []
    if probe.rank < probe.active:
        runners = [
            layer_runner(op.kind, dict(op.args), op.tokens, mode, b, device=where)  # type: ignore[arg-type]
            for op, mode, b in points
        ]

    def line_up(i: int) -> None:
        label = f"layer {points[i][0].id} batch {points[i][2]}"
        probe.beat(label)
        on_turn(label)
        probe.sync()
        dist.barrier()

    if runners:
        mine = turn_times(runners, probe.budget, LAYER_ROUNDS, line_up)
    else:  # a rank beyond the cores only lines up with the others
        for _ in range(LAYER_ROUNDS):
            for i in range(len(points)):
                line_up(i)
        mine = []
    got: list[list[list[list[float]]]] = [[] for _ in range(probe.world)] if probe.rank == 0 else []
    dist.gather_object(mine, got if probe.rank == 0 else None, dst=0)
    if probe.rank != 0:
        return [None] * len(points), 0.0
    timed = [turns for turns in got if turns]
    means: list[float | None] = []
    for i in range(len(points)):
        each = [probe.budget.summary([t for turn in turns[i] for t in turn]) for turns in timed]
        means.append(sum(each) / len(each) if each else None)
    jitter = rank_jitter([[turn for point in turns for turn in point] for turns in timed])
    return means, jitter


# Repeats per turn of a tensor-parallel layer point: a fixed count, as the group's ranks meet in
# its all-reduces on every repeat (``COMM_BUDGET``'s reason).
TP_REPEATS = 3


def _tp_groups(probe: Probe, degrees: Sequence[int]) -> dict[int, tuple[Any, int] | None]:
    """For each degree K, this rank's (process group, rank in it) among the groups of K
    consecutive ranks that fit on the active ranks, or None where it is in none (the groups
    made as a run makes them, ``tensor_parallel.tp_groups``: a collective)."""
    wanted = {
        k: [tuple(range(first, first + k)) for first in range(0, probe.active - k + 1, k)]
        for k in set(degrees)
    }
    made = tp_groups([g for groups in wanted.values() for g in groups], probe.rank)
    out: dict[int, tuple[Any, int] | None] = dict.fromkeys(wanted)
    for ranks, group in made.items():
        out[len(ranks)] = (group, ranks.index(probe.rank))
    return out


def tp_layers_seconds(
    probe: Probe,
    points: Sequence[tuple[MetaOp, str, int, int]],
    on_turn: Callable[[str], None] = lambda _label: None,
) -> list[float | None]:
    """Every (op, mode, degree K, rows per group) point: ``op``'s layer run K-way tensor
    parallel as the runtime runs it (``ShardView``: each rank its slice on all the rows,
    with the slice's all-reduces), by as many groups of K ranks side by side as fit on the
    active ranks, in turns as ``layers_seconds`` times. Rank 0 gets each point's mean over
    the ranks that ran it (None elsewhere)."""
    groups = _tp_groups(probe, [k for _, _, k, _ in points])
    where = str(probe.device)
    steps = []
    for op, mode, k, rows in points:
        mine = groups[k]
        if mine is None:
            steps.append(None)
            continue
        group, tp_rank = mine

        def wrap(layer: torch.nn.Module, tp_rank=tp_rank, k=k, group=group) -> ShardView:
            return ShardView(layer, tp_rank, k, group)

        args = dict(op.args)
        steps.append(layer_runner(op.kind, args, op.tokens, mode, rows, device=where, wrap=wrap))  # type: ignore[arg-type]
    times: list[list[float]] = [[] for _ in points]
    for _ in range(LAYER_ROUNDS):
        for i, step in enumerate(steps):
            op, _, k, rows = points[i]
            label = f"layer {op.id} {k}-way tensor parallel, {rows} rows"
            probe.beat(label)
            on_turn(label)
            probe.sync()
            dist.barrier()
            if step is not None:
                step()  # the turn's warm-up
                times[i].extend(step() for _ in range(TP_REPEATS))
    summaries = [probe.budget.summary(t) if t else None for t in times]
    got: list[list[float | None]] = [[] for _ in range(probe.world)] if probe.rank == 0 else []
    dist.gather_object(summaries, got if probe.rank == 0 else None, dst=0)
    if probe.rank != 0:
        return [None] * len(points)
    means: list[float | None] = []
    for i in range(len(points)):
        each = [ranks[i] for ranks in got if ranks[i] is not None]
        means.append(sum(each) / len(each) if each else None)
    return means


def first_layer_ratio(probe: Probe, op: MetaOp, batch: int) -> float | None:
    """``cost.profiler.first_layer_ratio`` of ``op``'s shape at ``batch``, on the active ranks
    side by side (contending for memory and caches as in a run); rank 0 gets their mean."""
    probe.beat(f"layer {op.id} batch {batch}: input without a gradient")
    dist.barrier()
    mine = None
    if probe.rank < probe.active:
        mine = P.first_layer_ratio(op, batch, probe.budget, device=str(probe.device))
    return _gather_mean(mine, probe.rank, probe.world)


# Seconds of work each rank does in one block of ``sharing_slowdown`` (on a core of its own),
# and how many pairs of blocks (alone, then crowded) it times: the median pair's ratio, as a
# machine whose speed drifts moved a single pair's between 0.8 and 1.4 here.
SHARING_BLOCK_S = 0.25
SHARING_PAIRS = 3


def sharing_slowdown(probe: Probe, op: MetaOp, mode: str, batch: int) -> float | None:
    """How much slower than its fair share a layer runs when every rank computes at once on
    fewer cores: a block of ``op``'s layer calls run on ``active`` ranks side by side (a core
    each), then on all ranks at once; fair sharing alone would make the second ``world /
    active`` times the first. Each block is timed whole, from the barrier to the last rank's
    end: a rank descheduled between two calls loses that time as a run's stage does (timing
    each call alone would miss it, calls shorter than the OS's time slice often running whole
    between two switches: so timed, tiny_mm on 4 ranks over 2 cores reads no slowdown while
    its crowded stages run well past the 2x of fair sharing). Rank 0 gets the ratio (at least
    1).
    Each pair of blocks is timed back to back (a ratio wants one state of a machine whose
    speed drifts), and the median of ``SHARING_PAIRS`` pairs is kept."""
    where = str(probe.device)
    step = layer_runner(op.kind, dict(op.args), op.tokens, mode, batch, device=where)  # type: ignore[arg-type]
    probe.beat(f"layer {op.id} batch {batch}: {probe.world} ranks on {probe.active} cores")
    for _ in range(probe.budget.warmup):
        step()
    once = min(step() for _ in range(3))
    calls = torch.tensor([math.ceil(SHARING_BLOCK_S / max(once, 1e-6))], dtype=torch.int64)
    dist.all_reduce(calls, op=dist.ReduceOp.MAX)  # every rank runs the same block
    fair = probe.world / probe.active
    ratios = []
    for _ in range(SHARING_PAIRS):
        alone = _block_seconds(probe, step, int(calls), probe.rank < probe.active)
        shared = _block_seconds(probe, step, int(calls), True)
        if alone > 0:
            ratios.append(shared / (alone * fair))
    if probe.rank != 0 or not ratios:
        return None
    return max(1.0, statistics.median(ratios))


def _block_seconds(probe: Probe, step: Callable[[], float], calls: int, mine: bool) -> float:
    """Wall seconds from a barrier until the last rank that runs ``calls`` calls (those with
    ``mine``) is done: every rank learns the slowest rank's time."""
    dist.barrier()
    start = time.perf_counter()
    if mine:
        for _ in range(calls):
            step()
    took = torch.tensor([time.perf_counter() - start if mine else 0.0], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took)


def input_stage_seconds(
    probe: Probe,
    graph: MetaGraph,
    data: TaskData,
    op: MetaOp,
    modality: str,
    tokens: int,
    batch: int,
) -> float | None:
    """Reading ``batch`` rows of the task and running ``op``'s input stage for ``modality`` on
    them, forward and (when it trains) backward, as the executor's first stage does."""
    first = op.segments[0][0]
    stage = build_part(graph, Part(first, f"input.{modality}"), 0, probe.dtype, probe.device)
    trains = any(p.requires_grad for p in stage.parameters())

    def step() -> None:
        raw = data.rows(op.task, 0, 0, batch)
        with torch.set_grad_enabled(trains):
            out = stage(raw[modality][:, :tokens])
            if trains:
                out.backward(torch.ones_like(out))

    return probe.compute(f"input stage {op.id}:{modality} batch {batch}", step)


def loss_seconds(
    probe: Probe, graph: MetaGraph, data: TaskData, sink: SinkLoss, batch: int
) -> float | None:
    """One sink's loss head on ``batch`` samples of its output, forward and backward, as the
    executor's loss phase computes it (reading the batch's targets included)."""
    op = graph.op(sink.sink)
    grad = op.needs_backward
    y = torch.randn(batch, op.out_tokens, op.out_width, dtype=probe.dtype, device=probe.device)
    y.requires_grad_(grad)
    head = None
    if sink.loss == "lm":
        head = build_part(graph, Part.from_key(sink.head_part or ""), 0, probe.dtype, probe.device)
        where = L.lm_target(graph, sink.sink)

    def step() -> None:
        raw = data.rows(sink.task, 0, 0, batch)
        if sink.loss == "lm":
            assert head is not None
            part = L.lm_loss_part(head, y, raw[where.modality], where, batch)
        elif sink.loss == "mse":
            part = L.mse_loss_part(y, raw[f"target:{sink.sink}"], batch)
        else:
            r = L.readout(y)
            part = L.infonce(r, r.detach().flip(0))
        float(part.detach())
        if part.requires_grad:
            part.backward()

    return probe.compute(f"loss {sink.task}/{sink.sink} batch {batch}", step)


# --- communication --------------------------------------------------------------------------


def collective_seconds(
    probe: Probe, kind: str, nbytes: int, ranks: Sequence[int], group: dist.ProcessGroup | None
) -> float | None:
    """One collective over ``ranks`` on a buffer of ``nbytes`` in all (the gradient it sums,
    scatters or gathers), the way the runtime calls it; rank 0 (always a member) times it."""
    probe.beat(f"{kind} {len(ranks)} ranks {nbytes} bytes")
    dist.barrier()
    mine = None
    if probe.rank in ranks:
        g = len(ranks)
        elem = torch.tensor([], dtype=probe.dtype).element_size()
        chunk = max(1, nbytes // (elem * g))
        rows = torch.ones(g * chunk, dtype=probe.dtype, device=probe.device)
        mine_row = torch.ones(chunk, dtype=probe.dtype, device=probe.device)

        def step() -> None:
            if kind == "all_reduce":
                dist.all_reduce(rows, group=group)
            elif kind == "reduce_scatter":
                _reduce_scatter(mine_row, rows, group=group)
            else:
                _all_gather(rows, mine_row, group=group)

        mine = time_repeats(step, COMM_BUDGET, probe.sync)
    return mine if probe.rank == 0 else None


def exchange_seconds(probe: Probe, nbytes: int) -> float | None:
    """An exchange phase: ranks in pairs (0-1, 2-3, ...) each send and receive ``nbytes`` with
    one ``batch_isend_irecv``, all pairs at once, as a wave boundary moves activations."""
    probe.beat(f"exchange {nbytes} bytes")
    dist.barrier()
    peer = probe.rank ^ 1
    mine = None
    if peer < probe.world:
        elem = torch.tensor([], dtype=probe.dtype).element_size()
        count = max(1, nbytes // elem)
        out = torch.ones(count, dtype=probe.dtype, device=probe.device)
        into = torch.empty(count, dtype=probe.dtype, device=probe.device)

        def step() -> None:
            ops = [
                dist.P2POp(dist.isend, out, peer, tag=1),
                dist.P2POp(dist.irecv, into, peer, tag=1),
            ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        mine = time_repeats(step, COMM_BUDGET, probe.sync)
    return mine if probe.rank == 0 else None


# --- optimizer and fixed costs --------------------------------------------------------------

# AdamW's settings in the optimizer timings (the values do not change its cost)
_HYPER = dict(lr=1e-3, weight_decay=0.01, beta1=0.9, beta2=0.999, eps=1e-8)


def _trainable(probe: Probe, graph: MetaGraph, key: str) -> list[torch.nn.Parameter]:
    """Part ``key``'s trainable tensors, built as a rank builds the part."""
    module = build_part(graph, Part.from_key(key), 0, probe.dtype, probe.device)
    return [t for t in module.parameters() if t.requires_grad]


def optimizer_seconds(probe: Probe, nbytes: int) -> float | None:
    """AdamW on a flat shard of ``nbytes`` of parameters, as the sharded optimizer steps it
    (the runtime's own step, ``optim.adamw_step``: torch's fused AdamW, fp32 state)."""
    elem = torch.tensor([], dtype=probe.dtype).element_size()
    n = max(1, nbytes // elem)
    sdtype = state_dtype(probe.dtype)
    w, g, m, v = (torch.rand(n, dtype=sdtype, device=probe.device) for _ in range(4))

    def step() -> None:
        adamw_step([w], [g], [m], [v], [1], _HYPER)

    return probe.compute(f"optimizer {nbytes} bytes", step)


def copy_seconds(probe: Probe, nbytes: int) -> float | None:
    """Gradients into a flat buffer and weights back out of it: two copies of ``nbytes``."""
    elem = torch.tensor([], dtype=probe.dtype).element_size()
    n = max(2, nbytes // elem)
    a = torch.rand(n // 2, dtype=probe.dtype, device=probe.device)
    b = torch.rand(n - n // 2, dtype=probe.dtype, device=probe.device)
    back = torch.empty(n, dtype=probe.dtype, device=probe.device)

    def step() -> None:
        flat = torch.cat([a, b])
        back.copy_(flat)

    return probe.compute(f"copy {nbytes} bytes", step)


def part_seconds(probe: Probe, graph: MetaGraph, key: str) -> float | None:
    """The optimizer's per-part work on one holder of part ``key`` (built as a rank builds it):
    its gradients flattened into the bucket's buffer, its weights copied into the holder's row
    and, after the update, back into each parameter tensor by tensor."""
    params = _trainable(probe, graph, key)
    if not params:
        return None
    for t in params:
        t.grad = torch.randn_like(t)
    n = sum(t.numel() for t in params)
    row = torch.empty(n, dtype=probe.dtype, device=probe.device)
    own = torch.empty(n, dtype=probe.dtype, device=probe.device)

    def step() -> None:
        with torch.no_grad():
            row.copy_(torch.cat([t.grad.reshape(-1) for t in params]))
            start = 0
            for t in params:
                own[start : start + t.numel()].copy_(t.reshape(-1))
                start += t.numel()
            start = 0
            for t in params:
                t.copy_(row[start : start + t.numel()].view_as(t))
                start += t.numel()

    return probe.compute(f"optimizer work of part {key}", step)


def part_alone_seconds(probe: Probe, graph: MetaGraph, key: str) -> tuple[float, int] | None:
    """AdamW over part ``key``'s tensors in place, as its only holder steps it (``zero.py``:
    one fused call over the part's own tensors, no flat buffer), and the part's bytes."""
    params = _trainable(probe, graph, key)
    if not params:
        return None
    weights = [t.detach().to(state_dtype(t.dtype)) for t in params]
    grads = [torch.randn_like(w) for w in weights]
    exp_avg = [torch.zeros_like(w) for w in weights]
    exp_avg_sq = [torch.zeros_like(w) for w in weights]

    def step() -> None:
        adamw_step(weights, grads, exp_avg, exp_avg_sq, [1] * len(weights), _HYPER)

    seconds = probe.compute(f"optimizer alone on part {key}", step)
    nbytes = sum(t.numel() * t.element_size() for t in params)
    return None if seconds is None else (seconds, nbytes)


def stage_seconds(probe: Probe) -> float | None:
    """A stage's fixed cost beyond its layers: the two heartbeats (forward and backward), an
    output-gradient buffer and an autograd call, as the executor spends them per wave."""
    x = torch.ones(4, 4, dtype=probe.dtype, device=probe.device, requires_grad=True)

    def step() -> None:
        probe.beat("stage forward")
        y = x * 2.0
        grad = torch.zeros_like(y)
        probe.beat("stage backward")
        torch.autograd.backward(y, grad)

    return probe.compute("stage bookkeeping", step)


def log_sizes(lo: int, hi: int, points: int) -> tuple[int, ...]:
    """``points`` sizes from ``lo`` to ``hi`` bytes, evenly spread on a log scale."""
    hi = max(hi, lo)
    if points <= 1 or hi == lo:
        return (hi,)
    a, b = math.log(lo), math.log(hi)
    return tuple(sorted({int(math.exp(a + (b - a) * i / (points - 1))) for i in range(points)}))


def batches_for(batch: int, devices: int, points: int) -> tuple[int, ...]:
    """Per-device batches a task's shards take on up to ``devices`` devices."""
    return planned_batches(max(batch, 1), devices, points)


def layer_mode(op: MetaOp) -> str:
    return "forward" if not op.needs_backward else ("input_grad" if op.frozen else "train")
