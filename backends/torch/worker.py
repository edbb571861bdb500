"""One rank of a training run, from process-group setup to the final checkpoint.

``run_rank`` is what every rank runs, whether ``--nproc`` spawned it (``launch.worker_command``),
``torchrun`` started it, or it is the only rank.
It builds the rank's parts, resumes from a checkpoint if there is one, runs the steps, reduces
gradients inside each part's device group and steps AdamW, and on rank 0 logs, shows progress
and writes the measured trace.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from spindle_dsl.errors import ExecutionError, SpindleError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan

from ..base import RunConfig, RunResult, StepRecord
from . import checkpoint
from .data import TaskData
from .losses import check_task
from .progress import Progress
from .schedule import Schedule, build_schedule
from .trace import Tracer, write_measured_trace
from .trainer import Trainer


@dataclass(frozen=True)
class Job:
    """Everything a rank needs; pickled to ``--nproc`` workers."""

    graph: MetaGraph
    plan: Plan | None  # None: rank 0 makes one (``planner``) and broadcasts it
    config: RunConfig
    datasets: Mapping[str, Any] = field(default_factory=dict)
    # more plans to step in turn on the same processes (bench): a plan, or (plan, RunConfig
    # fields it changes, e.g. {"optimizer_sharding": False})
    compare: tuple[Plan | tuple[Plan, Mapping[str, Any]], ...] = ()


def compare_item(item: Plan | tuple[Plan, Mapping[str, Any]]) -> tuple[Plan, dict[str, Any]]:
    """A ``compare`` item as (plan, config changes)."""
    if isinstance(item, Plan):
        return item, {}
    plan, changes = item
    allowed = {"recompute", "optimizer_sharding", "grad_collective"}
    if set(changes) - allowed:
        raise ExecutionError(
            f"a compared plan may change only {', '.join(sorted(allowed))}, "
            f"not {', '.join(sorted(set(changes) - allowed))}"
        )
    return plan, dict(changes)


def preflight(
    graph: MetaGraph, plan: Plan, world_size: int, datasets: Mapping[str, Any] | None = None
) -> Schedule:
    """Every check that needs no process group: the plan fits the graph and the world size,
    each task's loss can read its sinks, and bound datasets give what the tasks read. The
    ``--nproc`` parent runs it before spawning anything, so a bad job fails at once."""
    schedule = build_schedule(graph, plan, world_size)
    for task in graph.tasks:
        if task.batch > 0:
            check_task(graph, task)
    TaskData(graph, 0, datasets)
    return schedule


def pick_device(config: RunConfig, local_rank: int) -> tuple[str, torch.device]:
    """(process-group backend, device): NCCL on a GPU where asked or available, else gloo."""
    has_cuda = torch.cuda.is_available()
    if config.device == "cuda" and not has_cuda:
        raise ExecutionError("--device cuda was asked for but torch sees no CUDA device")
    if config.device == "cuda" or (config.device == "auto" and has_cuda):
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return "nccl", device
    return "gloo", torch.device("cpu")


def init_distributed(
    config: RunConfig, rank: int, world_size: int, local_rank: int, store: Any = None
) -> tuple[str, torch.device, bool]:
    """Join (or create) the default process group; returns whether this call created it."""
    backend, device = pick_device(config, local_rank)
    if dist.is_initialized():
        return dist.get_backend(), device, False
    kwargs: dict[str, Any] = {
        "backend": backend,
        "rank": rank,
        "world_size": world_size,
        "timeout": timedelta(seconds=config.collective_timeout_s),
    }
    if store is not None:
        kwargs["store"] = store
    elif world_size == 1:
        kwargs["store"] = dist.HashStore()
    else:
        kwargs["init_method"] = "env://"
    if backend == "nccl":
        kwargs["device_id"] = device  # eager NCCL init: later point-to-point needs no handshake
    dist.init_process_group(**kwargs)
    return backend, device, True


def _broadcast_plan(planner: Callable[[], Plan] | None, rank: int) -> Plan:
    """Rank 0's plan on every rank (a solver with a time limit need not be deterministic);
    a planning error reaches every rank, so none waits for a plan that will not come."""
    box: list[Any] = [None]
    if rank == 0:
        try:
            if planner is None:
                raise ExecutionError("no plan given and no planner to make one")
            box[0] = ("plan", planner().to_dict())
        except SpindleError as exc:
            box[0] = ("error", exc.render())
    dist.broadcast_object_list(box, src=0)
    what, payload = box[0]
    if what == "error":
        raise ExecutionError(payload if rank == 0 else f"rank 0 could not plan:\n{payload}")
    return Plan.from_dict(payload)


def run_rank(
    job: Job,
    rank: int,
    world_size: int,
    local_rank: int = 0,
    *,
    store: Any = None,
    planner: Callable[[], Plan] | None = None,
    heartbeat: Callable[[str], None] | None = None,
) -> RunResult | None:
    """Train on this rank; rank 0 returns the result, the others None."""
    config = job.config
    beat = heartbeat or (lambda _what: None)
    beat("joining the process group")
    backend, device, created = init_distributed(config, rank, world_size, local_rank, store)
    try:
        plan = job.plan if job.plan is not None else _broadcast_plan(planner, rank)
        return _train(job, plan, rank, world_size, backend, device, beat)
    finally:
        if created:
            dist.destroy_process_group()


def _train(
    job: Job,
    plan: Plan,
    rank: int,
    world_size: int,
    backend: str,
    device: torch.device,
    beat: Callable[[str], None],
) -> RunResult | None:
    config, graph = job.config, job.graph
    tracer = Tracer(rank, enabled=bool(config.trace))
    trainer = Trainer(graph, plan, config, job.datasets, rank, world_size, device, tracer, beat)
    # Plans to compare on these same processes: fresh models stepped in turn with the main
    # one, never traced, logged or checkpointed.
    others = [
        Trainer(
            graph, p, replace(config, **changes), job.datasets, rank, world_size, device,
            Tracer(rank, False), beat,
        )
        for p, changes in map(compare_item, job.compare)
    ]  # fmt: skip
    schedule, store, opt = trainer.schedule, trainer.store, trainer.opt
    meta = {"spec_sha256": graph.spec_sha256, "dtype": config.dtype, "seed": config.seed}
    start = 0
    if config.checkpoint_dir and config.resume:
        info = checkpoint.latest(config.checkpoint_dir)
        if info is not None:
            checkpoint.check_compatible(info, meta)
            checkpoint.load(info, store, opt)
            start = min(info.step, config.steps)
    lead = rank == 0
    log = open(config.log_json, "a" if start else "w") if lead and config.log_json else None  # noqa: SIM115
    progress = (
        Progress(config.steps, sum(t.batch for t in graph.tasks))
        if lead and config.progress
        else None
    )
    records: list[StepRecord] = []
    compared: list[list[StepRecord]] = [[] for _ in others]
    last_ckpt = None
    try:
        for step in range(start, config.steps):
            record = trainer.step(step)
            for i, other in enumerate(others):
                compared[i].append(other.step(step))
            records.append(record)
            if log is not None:
                log.write(json.dumps(record.to_json()) + "\n")
                log.flush()
            if progress is not None:
                progress.update(record.step, record.seconds, dict(record.losses))
            every = config.checkpoint_every
            if (
                config.checkpoint_dir
                and every
                and (step + 1) % every == 0
                and step + 1 < config.steps
            ):
                beat(f"step {step + 1} checkpoint")
                last_ckpt = checkpoint.save(
                    config.checkpoint_dir, step + 1, schedule, rank, store, opt, meta
                )
            if config.step_delay_s:
                time.sleep(config.step_delay_s)
        if config.checkpoint_dir and (records or checkpoint.latest(config.checkpoint_dir) is None):
            beat("final checkpoint")
            last_ckpt = checkpoint.save(
                config.checkpoint_dir, config.steps, schedule, rank, store, opt, meta
            )
    finally:
        if progress is not None:
            progress.close()
        if log is not None:
            log.close()
    trace_path = None
    if config.trace:
        gathered: list[Any] = [None] * world_size if lead else []
        dist.gather_object(tracer.spans, gathered if lead else None, dst=0)
        if lead:
            spans = [s for part in gathered for s in part]
            meta = {
                "spec": graph.spec_path,
                "ranks": world_size,
                "backend": backend,
                "scheduler": plan.solver.name,
                "predicted_iteration_s": plan.iteration_s,
            }
            write_measured_trace(config.trace, spans, schedule, plan.cluster.devices_per_node, meta)
            trace_path = config.trace
    # What each rank holds of the optimizer state, for the result (memory accounting, tests).
    held = [(t.opt.state_elements(), t.opt.state_bytes()) for t in (trainer, *others)]
    every: list[Any] = [None] * world_size if lead else []
    dist.gather_object(held, every if lead else None, dst=0)
    beat("done")
    dist.barrier()
    if not lead:
        return None
    return RunResult(
        steps=tuple(records),
        world_size=world_size,
        backend=backend,
        resumed_from=start,
        predicted_step_s=plan.iteration_s,
        checkpoint=str(last_ckpt) if last_ckpt else None,
        trace=trace_path,
        extra={
            "baselines": dict(plan.baselines),
            "scheduler": plan.solver.name,
            "compared": [tuple(c) for c in compared],
            # per rank: optimizer-state elements by part key, and bytes; then per compared plan
            "optimizer_state": [r[0][0] for r in every],
            "optimizer_state_bytes": [r[0][1] for r in every],
            "compared_optimizer_state": [[r[i][0] for r in every] for i in range(1, len(held))],
        },
    )
