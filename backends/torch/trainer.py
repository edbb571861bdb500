"""One plan's model on one rank, and one optimizer step of it.

A ``Trainer`` owns what a plan decides on a rank: the compiled schedule, the parts the rank
holds, their AdamW state (sharded over each part's holders at ZeRO stage 1, with the gradients
too at stage 2, nothing at stage 0), the gradient groups and their buckets, which MetaOps
recompute activations, how many micro-batch passes a step runs, the step executor and the
memory meter. Keeping it apart from the run loop lets one set of worker processes hold several
plans of the same spec side by side (each with its own fresh model) and step them in turn,
which is how the benchmark compares plans on the very same processes, under the same machine
load.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from spindle_dsl.errors import ExecutionError
from spindle_dsl.language.summary import train_flops
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan

from ..base import RecomputeMode, RunConfig, StepRecord
from .data import TaskData
from .executor import StepExecutor
from .grads import holder_groups, ready_ticks
from .memory import WATCHED_STEPS, MemoryMeter
from .optim import RankOptimizer, ReplicatedAdamW
from .params import DTYPES, PartStore
from .schedule import Schedule, build_schedule
from .shards import MAX_BUCKET_ELEMENTS, least_bucket_elements
from .tensor_parallel import tp_groups
from .trace import Tracer
from .zero import ShardedAdamW, gloo_has_reduce_scatter


def recompute_set(plan: Plan, mode: RecomputeMode) -> frozenset[str]:
    """The MetaOps whose layers run under activation checkpointing: those the plan marks
    (``plan``, the planner's memory model counts on it), every one (``all``) or none."""
    if mode == "none":
        return frozenset()
    return frozenset(m.id for m in plan.metaops if mode == "all" or m.recompute)


def zero_stage(plan: Plan, config: RunConfig) -> int:
    """The ZeRO stage a run uses: the config's, else the plan's; 0 with sharding off."""
    if not config.optimizer_sharding:
        return 0
    stage = config.zero_stage if config.zero_stage is not None else plan.zero_stage
    if stage == 0 and config.dtype == "bfloat16":
        raise ExecutionError(
            "the plan asks for zero_stage 0, but bfloat16 training keeps fp32 master weights in "
            "the sharded optimizer; run with --zero-stage 1 or 2, or train in float32"
        )
    return stage


def step_tokens(graph: MetaGraph) -> int:
    """Input tokens one step trains: per task, its batch times the tokens each sample brings
    from every modality it reads (a modality read twice counted once, at its most tokens)."""
    total = 0
    for task in graph.tasks:
        read: dict[str, int] = {}
        for op in graph.metaops:
            if op.task == task.name:
                for i in op.inputs:
                    if i.from_modality:
                        read[i.source] = max(read.get(i.source, 0), i.tokens)
        total += task.batch * sum(read.values())
    return total


def micro_batches(plan: Plan, config: RunConfig) -> int:
    """Micro-batch passes per step: the config's, else the plan's."""
    return config.micro_batches if config.micro_batches is not None else plan.micro_batches


def make_rank_optimizer(
    config: RunConfig,
    schedule: Schedule,
    rank: int,
    store: PartStore,
    tracer: Tracer,
    *,
    stage: int = 1,
    ready: Mapping | None = None,
    keep: Callable[[torch.Tensor, str], None] | None = None,
    cores_shared: bool = False,
) -> RankOptimizer:
    """The optimizer of ZeRO ``stage`` (a collective: it creates the holder groups);
    ``cores_shared``: a node's ranks outnumber its cores (``shards.least_bucket_elements``)."""
    groups = holder_groups(schedule, rank)
    hyper = dict(lr=config.lr, weight_decay=config.weight_decay, betas=config.betas, eps=config.eps)
    common = dict(
        tracer=tracer,
        ready=ready,
        keep=keep,
        clip_grad=config.clip_grad,
        lr_scales=config.lr_scales,
    )
    cap = config.bucket_elements if config.bucket_elements is not None else MAX_BUCKET_ELEMENTS
    common["max_bucket_elements"] = cap
    common["min_bucket_elements"] = least_bucket_elements(cores_shared, cap)
    if stage == 0:
        return ReplicatedAdamW(schedule, rank, store, groups, **common, **hyper)
    gloo_only = dist.get_backend() == "gloo" and not gloo_has_reduce_scatter()
    if config.grad_collective == "auto":
        scatter = not gloo_only
    elif config.grad_collective == "reduce_scatter" and gloo_only:
        raise ExecutionError(
            f"this torch ({torch.__version__}) has no reduce-scatter on gloo; "
            f"use grad_collective='all_reduce' or 'auto'"
        )
    else:
        scatter = config.grad_collective == "reduce_scatter"
    return ShardedAdamW(
        schedule, rank, store, groups, reduce_scatter=scatter, stage=stage, **common, **hyper
    )


class Trainer:
    """Parts, optimizer, gradient groups and executor of one plan on one rank (a collective
    to build: every rank builds the same trainers in the same order)."""

    def __init__(
        self,
        graph: MetaGraph,
        plan: Plan,
        config: RunConfig,
        datasets: Mapping[str, Any],
        rank: int,
        world_size: int,
        device: torch.device,
        tracer: Tracer,
        beat: Callable[[str], None],
        *,
        store: PartStore | None = None,
        positions: Callable[[str, int], int] | None = None,
        eval_datasets: Mapping[str, Any] | None = None,
    ):
        """``store``: the rank's parts, already built (a run switching to the next phase of a
        schedule hands them over, ``switch.py``); ``positions``: where each task's samples
        start at a step (``TaskData``); ``eval_datasets``: held-out data by task (the tasks
        of this plan among them are evaluated)."""
        self.graph, self.plan, self.device, self.tracer, self.beat = (
            graph,
            plan,
            device,
            tracer,
            beat,
        )
        dtype = DTYPES[config.dtype]
        self.schedule = build_schedule(graph, plan, world_size)
        beat("building parameters")
        self.store = store or PartStore(
            graph, self.schedule.parts_of(rank), config.seed, dtype, device
        )
        self.meter = MemoryMeter(self.store, device, enabled=config.measure_memory)
        self.zero_stage = zero_stage(plan, config)
        self.micro_batches = micro_batches(plan, config)
        self.opt = make_rank_optimizer(
            config,
            self.schedule,
            rank,
            self.store,
            tracer,
            stage=self.zero_stage,
            ready=ready_ticks(graph, self.schedule),
            keep=self.meter.keep,
            cores_shared=graph.cluster.shared_cores is not None,
        )
        data = TaskData(graph, config.seed, datasets, dtype, device, positions)
        self.executor = StepExecutor(
            graph,
            self.schedule,
            rank,
            self.store,
            data,
            dtype=dtype,
            device=device,
            tracer=tracer,
            heartbeat=beat,
            recompute=recompute_set(plan, config.recompute),
            micro_batches=self.micro_batches,
            listener=self.opt.sync,
            meter=self.meter,
            tp_groups=tp_groups(self.schedule.tp_groups, rank),
        )
        self.tasks = [t.name for t in graph.tasks if t.batch > 0]
        held = {t: d for t, d in (eval_datasets or {}).items() if t in self.tasks}
        self.eval_tasks = [t for t in self.tasks if t in held]
        self.eval_data = TaskData(graph, config.seed, held, dtype, device) if held else None
        self.steps_run = 0  # by this trainer (a run resumed or switched to it starts anew)
        self.lr_at = config.lr_at
        # what a step record carries for throughput: samples, tokens, FLOPs, the peak
        self.figures = dict(
            samples=sum(t.batch for t in graph.tasks),
            tokens=step_tokens(graph),
            flops=train_flops(graph),
            peak_flops=graph.cluster.device.peak_flops * world_size,
        )

    def step(self, step: int) -> StepRecord:
        """Forward and backward of every micro-batch pass (the gradient reduction overlapping
        the backward), then AdamW, for step ``step`` (0-based); the record carries each task's
        loss summed over all ranks, and this rank's wall time."""
        t0 = time.perf_counter()
        lr = self.lr_at(step)
        with self.tracer.span(f"step {step + 1}", "step"):
            self.opt.set_lr(lr)  # before the passes: a bucket may step during the backward
            shares = self.executor.run(step)
            self.beat(f"step {step + 1} gradient reduction and optimizer")
            stats = self.opt.step()
            # the squares of each rank's own gradient parts ride along with the losses
            owned = stats.owned_sq if stats.total_sq is None else 0.0
            totals = torch.tensor(
                [*(shares[t] for t in self.tasks), owned], dtype=torch.float64, device=self.device
            )
            dist.all_reduce(totals)  # also lines the ranks up, so step times compare
        self.steps_run += 1
        if self.steps_run == WATCHED_STEPS:
            self.meter.stop()
        *values, summed = totals.tolist()
        norm = math.sqrt(stats.total_sq if stats.total_sq is not None else summed)
        losses = tuple(zip(self.tasks, values, strict=True))
        seconds = time.perf_counter() - t0
        return StepRecord(
            step + 1, losses, seconds, self.graph.mix, lr=lr, grad_norm=norm, **self.figures
        )

    def evaluate(self, batches: int) -> tuple[tuple[str, float], ...]:
        """Each evaluated task's mean loss over its first ``batches`` held-out batches (a
        collective: every rank evaluates at the same step), forward only, changing nothing."""
        sums = dict.fromkeys(self.eval_tasks, 0.0)
        for i in range(batches):
            self.beat(f"eval batch {i + 1} of {batches}")
            assert self.eval_data is not None, "a trainer without held-out data has no tasks"
            shares = self.executor.evaluate(i, self.eval_data, self.eval_tasks)
            for task in self.eval_tasks:
                sums[task] += shares.get(task, 0.0)
        totals = torch.tensor(list(sums.values()), dtype=torch.float64, device=self.device)
        dist.all_reduce(totals)
        return tuple(zip(self.eval_tasks, (v / batches for v in totals.tolist()), strict=True))
