"""One rank of a training run, from process-group setup to the final checkpoint.

``run_rank`` is what every rank runs, whether ``--nproc`` spawned it (``launch.worker_command``),
``torchrun`` started it, or it is the only rank.
It builds the rank's parts, resumes from a checkpoint if there is one, runs the steps, reduces
gradients inside each part's device group and steps AdamW, and on rank 0 logs, shows progress
and writes the measured trace. A spec with a schedule of mixes runs as phases, each with its
own plan: at a phase's first step the rank switches plans in place (``switch.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from spindle_dsl.errors import ExecutionError, SpindleError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.phases import MixSchedule
from spindle_dsl.plan.bundle import PlanBundle
from spindle_dsl.plan.model import Plan

from ..base import RunConfig, RunResult, StepRecord
from . import checkpoint
from .allocator import keep_freed_host_memory
from .data import TaskData
from .losses import check_task
from .params import DTYPES
from .parts import graph_parts
from .phased import Parked, RunPhase, phase_index, resume_parked, run_phases
from .progress import Progress
from .schedule import Schedule, build_schedule
from .steplog import StepLog
from .switch import switch
from .trace import Tracer, write_measured_trace
from .trainer import Trainer
from .weights import check_weights


@dataclass(frozen=True)
class Job:
    """Everything a rank needs; pickled to ``--nproc`` workers."""

    graph: MetaGraph
    # None: rank 0 makes one (``planner``) and broadcasts it; a bundle with ``schedule``
    plan: Plan | PlanBundle | None
    config: RunConfig
    datasets: Mapping[str, Any] = field(default_factory=dict)
    # more plans to step in turn on the same processes (bench): a plan, or (plan, RunConfig
    # fields it changes, e.g. {"optimizer_sharding": False})
    compare: tuple[Plan | tuple[Plan, Mapping[str, Any]], ...] = ()
    # the spec's schedule of mixes (its first phase's graph is ``graph``), None without one
    schedule: MixSchedule | None = None
    # held-out data by task: evaluated every ``config.eval_every`` steps and after the last
    eval_datasets: Mapping[str, Any] = field(default_factory=dict)


def compare_item(item: Plan | tuple[Plan, Mapping[str, Any]]) -> tuple[Plan, dict[str, Any]]:
    """A ``compare`` item as (plan, config changes)."""
    if isinstance(item, Plan):
        return item, {}
    plan, changes = item
    allowed = {"recompute", "optimizer_sharding", "grad_collective", "micro_batches", "zero_stage"}
    if set(changes) - allowed:
        raise ExecutionError(
            f"a compared plan may change only {', '.join(sorted(allowed))}, "
            f"not {', '.join(sorted(set(changes) - allowed))}"
        )
    return plan, dict(changes)


def preflight(
    graph: MetaGraph,
    plan: Plan,
    world_size: int,
    datasets: Mapping[str, Any] | None = None,
    eval_datasets: Mapping[str, Any] | None = None,
) -> Schedule:
    """Every check that needs no process group: the plan fits the graph and the world size,
    each task's loss can read its sinks, bound datasets (held-out ones too) give what the
    tasks read, and pretrained weights files hold what their modules need. The ``--nproc``
    parent runs it before spawning anything, so a bad job fails at once."""
    schedule = build_schedule(graph, plan, world_size)
    for task in graph.tasks:
        if task.batch > 0:
            check_task(graph, task)
    TaskData(graph, 0, datasets)
    held = {t: d for t, d in (eval_datasets or {}).items() if t in {x.name for x in graph.tasks}}
    if held:
        TaskData(graph, 0, held)
    check_weights(graph, graph_parts(graph))
    return schedule


def check_eval_tasks(graphs: Sequence[MetaGraph], eval_datasets: Mapping[str, Any]) -> None:
    """Held-out data named for a task that no phase of the run trains is an error."""
    known = {t.name for g in graphs for t in g.tasks}
    unknown = sorted(set(eval_datasets) - known)
    if unknown:
        raise ExecutionError(
            f"held-out data for unknown task(s) {', '.join(unknown)} "
            f"(the run's tasks: {', '.join(sorted(known))})"
        )


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


def _broadcast_plan(
    planner: Callable[[], Plan | PlanBundle] | None, rank: int
) -> Plan | PlanBundle:
    """Rank 0's plan (or plan bundle) on every rank (a solver with a time limit need not be
    deterministic); a planning error reaches every rank, so none waits for a plan that will
    not come."""
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
    return PlanBundle.from_dict(payload) if "phases" in payload else Plan.from_dict(payload)


def run_rank(
    job: Job,
    rank: int,
    world_size: int,
    local_rank: int = 0,
    *,
    store: Any = None,
    planner: Callable[[], Plan | PlanBundle] | None = None,
    heartbeat: Callable[[str], None] | None = None,
) -> RunResult | None:
    """Train on this rank; rank 0 returns the result, the others None."""
    config = job.config
    beat = heartbeat or (lambda _what: None)
    keep_freed_host_memory()  # before the first step allocates (see ``allocator``)
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
    plan: Plan | PlanBundle,
    rank: int,
    world_size: int,
    backend: str,
    device: torch.device,
    beat: Callable[[str], None],
) -> RunResult | None:
    """Train ``plan`` (a bundle's phases in turn, switching plans between them) on this rank:
    resume from the latest checkpoint where asked, run the steps, then gather the trace and
    every rank's reports on rank 0, which alone returns the result. Every rank makes the same
    collectives in the same order."""
    config, graph = job.config, job.graph
    phases = run_phases(graph, plan, job.schedule)
    tracer = Tracer(rank, enabled=bool(config.trace), device=device)
    make = _trainer_factory(job, rank, world_size, device, tracer, beat)
    meta = {"spec_sha256": graph.spec_sha256, "dtype": config.dtype, "seed": config.seed}
    info = _resume_point(config, meta)
    start = min(info.step, config.steps) if info is not None else 0
    current = phase_index(phases, min(start, max(config.steps - 1, 0)))
    trainer = make(phases[current].graph, phases[current].plan)
    others = _compared_trainers(job, rank, world_size, device, beat)
    parked = _resume_parts(info, job, trainer, phases, rank, world_size)
    run = _Run(
        job=job, phases=phases, rank=rank, world_size=world_size, beat=beat, tracer=tracer,
        make=make, meta=meta, trainer=trainer, current=current, others=others, parked=parked,
        compared=[[] for _ in others],
    )  # fmt: skip
    del trainer  # held by ``run`` alone, so a plan switch frees the trainer it replaces
    _run_steps(run, start)
    trace_path = _gather_trace(run, backend)
    lead = rank == 0
    if job.schedule is not None:  # every rank's view of the switches, for the result
        views: list[Any] = [None] * world_size if lead else []
        dist.gather_object(run.switches, views if lead else None, dst=0)
        run.switches = [
            {**s, "per_rank": [v[i] for v in views]} for i, s in enumerate(run.switches)
        ]
    # What each rank holds of the optimizer state, and its measured peak memory, for the
    # result (memory accounting, tests).
    held = [_memory_report(t) for t in (run.trainer, *others)]
    every: list[Any] = [None] * world_size if lead else []
    dist.gather_object(held, every if lead else None, dst=0)
    beat("done")
    dist.barrier()
    if not lead:
        return None
    return _result(run, start, backend, trace_path, len(held), every)


@dataclass
class _Run:
    """One rank's training run under way: what stepping needs (the job, its phases, the
    trainer factory, the checkpoint metadata, the plans compared alongside) and what it has
    made so far (the current trainer and phase, parked parts, records, switches and the last
    checkpoint), shared by the functions that make up ``_train``."""

    job: Job
    phases: tuple[RunPhase, ...]
    rank: int
    world_size: int
    beat: Callable[[str], None]
    tracer: Tracer
    make: Callable[..., Trainer]
    meta: dict[str, Any]
    trainer: Trainer
    current: int
    others: list[Trainer]
    parked: Parked
    compared: list[list[StepRecord]]
    records: list[StepRecord] = field(default_factory=list)
    switches: list[dict[str, Any]] = field(default_factory=list)
    last_ckpt: Any = None


def _trainer_factory(
    job: Job,
    rank: int,
    world_size: int,
    device: torch.device,
    tracer: Tracer,
    beat: Callable[[str], None],
) -> Callable[..., Trainer]:
    """Makes the main trainer for a phase's graph and plan (optionally on an existing part
    store, as a plan switch does), traced and fed the job's data."""
    config = job.config
    positions = job.schedule.first_sample if job.schedule is not None else None

    def make(g: MetaGraph, p: Plan, store: Any = None) -> Trainer:
        return Trainer(g, p, config, job.datasets, rank, world_size, device, tracer, beat,
                       store=store, positions=positions,
                       eval_datasets=job.eval_datasets)  # fmt: skip

    return make


def _resume_point(config: RunConfig, meta: dict[str, Any]) -> Any:
    """The latest checkpoint to resume from (None when not resuming or there is none),
    checked to have been made by the same spec, dtype and seed."""
    info = None
    if config.checkpoint_dir and config.resume:
        info = checkpoint.latest(config.checkpoint_dir)
        if info is not None:
            checkpoint.check_compatible(info, meta)
    return info


def _compared_trainers(
    job: Job, rank: int, world_size: int, device: torch.device, beat: Callable[[str], None]
) -> list[Trainer]:
    """Plans to compare on these same processes: fresh models stepped in turn with the main
    one, never traced, logged or checkpointed."""
    config = job.config
    return [
        Trainer(
            job.graph, p, replace(config, **changes), job.datasets, rank, world_size, device,
            Tracer(rank, False), beat,
        )
        for p, changes in map(compare_item, job.compare)
    ]  # fmt: skip


def _resume_parts(
    info: Any,
    job: Job,
    trainer: Trainer,
    phases: tuple[RunPhase, ...],
    rank: int,
    world_size: int,
) -> Parked:
    """Load the checkpoint's parts into the trainer (with a schedule, only those the current
    phase lists) and return the parts parked for other phases (none without a checkpoint)."""
    config = job.config
    parked = Parked()
    if info is not None:
        scheduled = job.schedule is not None
        checkpoint.load(info, trainer.store, trainer.opt, only_listed=scheduled)
        if scheduled:
            parked = resume_parked(
                info, set(trainer.schedule.holder_map), phases, rank, world_size,
                seed=config.seed, dtype=DTYPES[config.dtype],
            )  # fmt: skip
    return parked


def _run_steps(run: _Run, start: int) -> None:
    """Run the optimizer steps from ``start`` on and the final checkpoint; rank 0 logs each
    step and shows progress, closing both however the loop ends."""
    config = run.job.config
    lead = run.rank == 0
    log = StepLog(config.log_json, config.tensorboard, append=bool(start)) if lead else None
    progress = (
        Progress(config.steps, sum(t.batch for t in run.trainer.graph.tasks))
        if lead and config.progress
        else None
    )
    try:
        for step in range(start, config.steps):
            _run_step(run, step, log, progress)
        if config.checkpoint_dir and (
            run.records or checkpoint.latest(config.checkpoint_dir) is None
        ):
            run.beat("final checkpoint")
            run.last_ckpt = _save(config, config.steps, run.trainer, run.parked, run.rank, run.meta)
    finally:
        if progress is not None:
            progress.close()
        if log is not None:
            log.close()


def _run_step(run: _Run, step: int, log: StepLog | None, progress: Progress | None) -> None:
    """One optimizer step (after a plan switch where a new phase begins): the main trainer's
    step, its evaluation when due, the compared plans' steps, the log and progress line, a
    periodic checkpoint and the configured delay."""
    config = run.job.config
    switch_s = _switch_if_due(run, step, progress)
    record = run.trainer.step(step)
    if switch_s is not None:
        record = replace(record, switch_s=switch_s)
    if run.trainer.eval_tasks and _eval_due(config, step):
        record = replace(record, eval_losses=run.trainer.evaluate(config.eval_batches))
    for i, other in enumerate(run.others):
        run.compared[i].append(other.step(step))
    run.records.append(record)
    if log is not None:
        log.write(record)
    if progress is not None:
        progress.update(record)
    every = config.checkpoint_every
    if config.checkpoint_dir and every and (step + 1) % every == 0 and step + 1 < config.steps:
        run.beat(f"step {step + 1} checkpoint")
        run.last_ckpt = _save(config, step + 1, run.trainer, run.parked, run.rank, run.meta)
    if config.step_delay_s:
        time.sleep(config.step_delay_s)


def _switch_if_due(run: _Run, step: int, progress: Progress | None) -> float | None:
    """Where ``step`` begins a new phase, switch the trainer to its plan (recording the
    switch and noting it on the progress line) and return the seconds it took; else None."""
    if phase_index(run.phases, step) == run.current:
        return None
    config = run.job.config
    run.current = phase_index(run.phases, step)
    phase = run.phases[run.current]
    run.beat(f"step {step + 1} switching to mix {phase.mix}")
    with run.tracer.span(f"switch to {phase.mix}", "switch", step=step + 1):
        run.trainer, stats = switch(
            run.trainer, phase.graph, phase.plan, run.parked, run.make, rank=run.rank,
            world_size=run.world_size, seed=config.seed, dtype=DTYPES[config.dtype],
        )  # fmt: skip
    run.switches.append({"step": step, "mix": phase.mix, **stats.__dict__})
    if progress is not None:
        progress.samples = sum(t.batch for t in phase.graph.tasks)
        progress.note(
            f"switched to mix {phase.mix} (phase {run.current + 1} of {len(run.phases)}) "
            f"before step {step + 1} in {stats.seconds:.3f} s"
        )
    return stats.seconds


def _gather_trace(run: _Run, backend: str) -> str | None:
    """With ``trace`` set, gather every rank's measured spans on rank 0, which writes the
    trace (against each phase's schedule) and gets its path; None elsewhere or untraced."""
    config, world_size, trainer = run.job.config, run.world_size, run.trainer
    if not config.trace:
        return None
    lead = run.rank == 0
    gathered: list[Any] = [None] * world_size if lead else []
    dist.gather_object(run.tracer.spans, gathered if lead else None, dst=0)
    if not lead:
        return None
    phases = run.phases
    spans = [s for part in gathered for s in part]
    meta = {
        "spec": run.job.graph.spec_path,
        "ranks": world_size,
        "backend": backend,
        "scheduler": trainer.plan.solver.name,
        "predicted_iteration_s": trainer.plan.iteration_s,
        **({"phases": _phase_meta(phases)} if run.job.schedule is not None else {}),
    }
    compiled = [build_schedule(p.graph, p.plan, world_size) for p in phases]

    def schedule_at(step: int) -> Schedule:  # 1-based, as the spans record it
        return compiled[phase_index(phases, step - 1)]

    dpn = trainer.plan.cluster.devices_per_node
    write_measured_trace(config.trace, spans, schedule_at, dpn, meta)
    return config.trace


def _result(
    run: _Run,
    start: int,
    backend: str,
    trace_path: str | None,
    n_held: int,
    every: list[Any],
) -> RunResult:
    """Rank 0's result: the step records, the predicted step time, and in ``extra`` the
    plan's baselines, phases and switches, the compared plans' records, and every rank's
    optimizer state and peak memory (``every``: per rank, one report per trainer of
    ``n_held``, the main one first)."""
    trainer, records, world_size = run.trainer, run.records, run.world_size
    phases = run.phases
    predicted = _predicted(phases, records) if records else trainer.plan.iteration_s
    return RunResult(
        steps=tuple(records),
        world_size=world_size,
        backend=backend,
        resumed_from=start,
        predicted_step_s=predicted,
        checkpoint=str(run.last_ckpt) if run.last_ckpt else None,
        trace=trace_path,
        extra={
            "baselines": dict(trainer.plan.baselines),
            "scheduler": trainer.plan.solver.name,
            **(
                {"phases": _phase_meta(phases), "switches": run.switches}
                if run.job.schedule is not None
                else {}
            ),
            "compared": [tuple(c) for c in run.compared],
            # per rank: optimizer-state elements by part key, and bytes; then per compared plan
            "optimizer_state": [r[0][0] for r in every],
            "optimizer_state_bytes": [r[0][1] for r in every],
            "compared_optimizer_state": [[r[i][0] for r in every] for i in range(1, n_held)],
            # per rank: measured peak tensor bytes, the plan's prediction, the terms at the peak
            "measured_peak_bytes": [r[0][2] for r in every],
            "predicted_peak_bytes": _predicted_peaks(trainer.plan, world_size),
            "peak_terms": [r[0][3] for r in every],
            "kept_by_stage": [r[0][4] for r in every],  # activation bytes each stage kept
            "compared_peak_bytes": [[r[i][2] for r in every] for i in range(1, n_held)],
            "micro_batches": trainer.micro_batches,
            "zero_stage": trainer.zero_stage,
        },
    )


def _eval_due(config: RunConfig, step: int) -> bool:
    """Whether the run evaluates after 0-based step ``step``: every ``eval_every`` steps, and
    after the last."""
    done = step + 1
    return done == config.steps or (config.eval_every > 0 and done % config.eval_every == 0)


def _save(
    config: RunConfig, step: int, trainer: Trainer, parked: Parked, rank: int, meta: dict
) -> Any:
    """A checkpoint of the current phase's parts and of the parked ones (keeping the newest
    ``config.keep_checkpoints``)."""
    assert config.checkpoint_dir is not None, "checkpoints are written only with a folder"
    return checkpoint.save(
        config.checkpoint_dir, step, trainer.schedule, rank, trainer.store, trainer.opt,
        {**meta, "mix": trainer.graph.mix},
        parked=parked.for_checkpoint(), parked_parts=parked.parts(),
        keep=config.keep_checkpoints,
    )  # fmt: skip


def _phase_meta(phases: tuple[RunPhase, ...]) -> list[dict[str, Any]]:
    return [
        {"first_step": p.first_step, "mix": p.mix, "predicted_step_s": p.plan.iteration_s,
         "scheduler": p.plan.solver.name}
        for p in phases
    ]  # fmt: skip


def _predicted(phases: tuple[RunPhase, ...], records: list[StepRecord]) -> float:
    """The plans' predicted step time, averaged over the steps this run took."""
    times = [phases[phase_index(phases, r.step - 1)].plan.iteration_s for r in records]
    return sum(times) / len(times)


def _memory_report(trainer: Trainer) -> tuple:
    """What one rank reports of a trainer's memory: optimizer-state elements by part and bytes,
    the measured peak, its terms, and the activations each stage kept."""
    meter = trainer.meter
    return (
        trainer.opt.state_elements(),
        trainer.opt.state_bytes(),
        meter.peak_bytes(),
        meter.peak_terms(),
        meter.stage_kept,
    )


def _predicted_peaks(plan: Plan, world_size: int) -> list[int | None]:
    """The plan's predicted peak bytes per rank (None where the plan predicts none)."""
    predicted = list(plan.memory_bytes)
    return [predicted[r] if r < len(predicted) else None for r in range(world_size)]
