"""``spindle train``: run a wave plan as real training on torch.distributed.

Three ways to start it: ``--nproc N`` spawns N local worker processes (gloo on CPU, NCCL on
GPUs); under ``torchrun`` (one or many nodes) every process runs this command and takes its
rank from RANK, LOCAL_RANK and WORLD_SIZE; with neither, a spec whose cluster is ``cpu``
devices spawns one worker per device. Without ``--plan`` it plans first (``--scheduler``,
default: the default scheduler) for exactly as many devices as there are ranks. A spec with a
``schedule`` trains each phase's mix with its own plan (``--plan`` then takes the plan bundle
`spindle plan` writes), switching plans inside the running job. The recipe (steps, the
learning-rate schedule, AdamW, clipping, evaluation, checkpoints) comes from the spec's
``train`` block, each setting overridden by its flag.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from dataclasses import replace
from typing import Any

from spindle_dsl.atomic import write_atomic
from spindle_dsl.cli.calibration import (
    Calibration,
    add_cache_argument,
    calibrate_train,
    uncalibrated_text,
)
from spindle_dsl.cli.cmd_data import DATA_HELP, bind_data, describe_data
from spindle_dsl.cli.common import (
    add_spec_arguments,
    add_tp_argument,
    load_compiled,
    load_cost_model,
)
from spindle_dsl.errors import ExecutionError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``spindle train`` flags, in the order ``--help`` and docs/cli.md list them."""
    _add_plan_arguments(parser)
    _add_output_arguments(parser)
    _add_execution_arguments(parser)
    _add_data_arguments(parser)
    _add_reporting_arguments(parser)
    _add_recipe_arguments(parser)


def _add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The spec, which plan to run (given, or made here by a scheduler) and how many local
    workers to spawn for it."""
    from spindle_dsl.planner import DEFAULT_TIME_LIMIT_S, SCHEDULERS

    add_spec_arguments(parser)
    add_cache_argument(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--plan", metavar="PLAN.json", help="run this plan (from `spindle plan`)")
    source.add_argument(
        "--scheduler",
        default="default",
        choices=SCHEDULERS,
        help="plan with this scheduler or baseline first (default: %(default)s)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        metavar="S",
        help="planning time budget in seconds (default: %(default)s)",
    )
    parser.add_argument("--nproc", type=int, help="spawn this many local worker processes")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the run's step log, scalars, checkpoints and measured trace go."""
    parser.add_argument(
        "--log-json",
        metavar="FILE",
        help="one JSON line per step: loss and eval_loss per task, lr, grad_norm, seconds, "
        "tokens_per_s, samples_per_s, mfu",
    )
    parser.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write the same figures as TensorBoard scalars into DIR (needs the "
        "[tensorboard] extra)",
    )
    parser.add_argument("--checkpoint-dir", metavar="DIR", help="checkpoint here (and resume)")
    parser.add_argument(
        "--no-resume", action="store_true", help="start afresh even if DIR has a checkpoint"
    )
    parser.add_argument("--trace", metavar="FILE.json", help="write a measured Chrome trace")


def _add_execution_arguments(parser: argparse.ArgumentParser) -> None:
    """How the workers train: dtype, device, activation recompute and optimizer sharding."""
    parser.add_argument(
        "--dtype",
        choices=("float32", "float64", "bfloat16"),
        default="float32",
        help="training dtype; bfloat16 trains mixed precision, with fp32 master weights and "
        "AdamW state in the sharded optimizer (default: %(default)s)",
    )
    parser.add_argument(
        "--run-on",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where workers train: auto picks CUDA (NCCL) where torch sees a GPU, else CPU (gloo)",
    )
    parser.add_argument(
        "--recompute",
        choices=("all", "plan", "none"),
        default="plan",
        help="activation recompute: for the MetaOps the plan marks (the planner does so when a "
        "plan would not fit in memory otherwise), for all, or for none (default: %(default)s)",
    )
    parser.add_argument(
        "--optimizer-sharding",
        choices=("on", "off"),
        default="on",
        help="shard each part's AdamW state over the ranks holding the part (ZeRO-1), as the "
        "planner's memory model assumes; off keeps it whole on every holder (default: on)",
    )


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The training data, and the levers (micro-batches, ZeRO stage) that override a plan's."""
    parser.add_argument("--data", action="append", metavar="DIR|TASK=PATH", help=DATA_HELP)
    add_tp_argument(parser)
    parser.add_argument(
        "--micro-batches",
        type=int,
        metavar="K",
        help="run each step as K micro-batch passes (gradient accumulation, one optimizer "
        "step; every task's batch split into K contiguous parts): the plan made here is made "
        "for K; with --plan, K replaces the plan's (with a warning)",
    )
    parser.add_argument(
        "--zero-stage",
        type=int,
        choices=(0, 1, 2),
        help="ZeRO stage: 0 shards nothing (as --optimizer-sharding off), 1 each part's AdamW "
        "state over its holders, 2 its gradients too; the plan made here is made for it, "
        "with --plan it replaces the plan's (with a warning)",
    )


def _add_reporting_arguments(parser: argparse.ArgumentParser) -> None:
    """Hang detection, the progress line and the JSON summary of the run."""
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=45.0,
        metavar="S",
        help="stop every rank when one makes no progress for S seconds (default: 45)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress line")
    parser.add_argument(
        "--summary-json",
        metavar="FILE",
        help="write measured and predicted step time (and the plan's baselines) as JSON",
    )


# (flag, type, metavar, help): each overrides the train block's setting of the same name
_RECIPE_FLAGS: tuple[tuple[str, type, str | None, str], ...] = (
    ("--steps", int, None, "optimizer steps in all (default: 10)"),
    ("--lr", float, None, "the peak learning rate (default: 1e-3)"),
    ("--warmup-steps", int, "N", "linear warmup over the first N steps (default: 0)"),
    ("--lr-decay", str, "constant|linear|cosine", "the decay after the warmup, to --min-lr at "
     "the last step (default: constant)"),
    ("--min-lr", float, None, "where linear or cosine decay ends (default: 0)"),
    ("--weight-decay", float, None, "AdamW's decoupled weight decay (default: 0.01)"),
    ("--beta1", float, None, "AdamW's beta1 (default: 0.9)"),
    ("--beta2", float, None, "AdamW's beta2 (default: 0.999)"),
    ("--eps", float, None, "AdamW's eps (default: 1e-8)"),
    ("--clip-grad", float, "NORM", "clip the global gradient norm to NORM (default: 0, off)"),
    ("--seed", int, None, "parameter initialisation and synthetic data (default: 0)"),
    ("--eval-every", int, "K", "evaluate the held-out data every K steps (default: 0, after "
     "the last step only)"),
    ("--eval-batches", int, "N", "held-out batches per evaluation (default: 1)"),
    ("--checkpoint-every", int, "K", "also checkpoint every K steps (default: 0)"),
    ("--keep-checkpoints", int, "N", "keep the newest N checkpoints (default: 0, all)"),
)  # fmt: skip


def _add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "training recipe (each flag overrides the spec's train block; defaults as given there)"
    )
    for name, kind, metavar, text in _RECIPE_FLAGS:
        group.add_argument(name, type=kind, metavar=metavar, help=text)
    group.add_argument(
        "--eval-data",
        action="append",
        metavar="DIR|TASK=PATH",
        help='held-out data, given as --data is; overrides the spec\'s eval_data = "..."',
    )


def train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe flags given, as ``TrainSettings`` fields."""
    keys = [name[2:].replace("-", "_") for name, *_ in _RECIPE_FLAGS]
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def run(args: argparse.Namespace) -> int:
    """Compile the spec, pick or make the plan, and train it: in this process's rank under
    torchrun, else in spawned local workers; rank 0 (or the parent) prints the summary."""
    from spindle_dsl.backends.torch import TorchBackend
    from spindle_dsl.plan.bundle import read_plan_file

    env, world = _launch(args)
    compiled = _compile(args, env)
    graph, schedule, settings = compiled.graph, compiled.schedule, compiled.train
    if world is None:
        if graph.cluster.device.name != "cpu":
            raise ExecutionError(
                f"the spec's cluster has {graph.cluster.devices} {graph.cluster.device.name} "
                f"devices: start the run with torchrun, or pass --nproc N to spawn local workers"
            )
        world = graph.cluster.devices
        args.nproc = world

    made: list[Any] = []
    calibrations: list[Calibration] = []
    planner = _planner(args, graph, schedule, made, calibrations)
    plan = read_plan_file(args.plan) if args.plan else None
    if plan is not None and (env is None or env[0] == 0):
        _warn_overridden_levers(args, plan)
    trace, own_trace = _trace_path(args, settings.steps)
    config = _run_config(args, settings, trace)
    datasets = bind_data(args.data, graph)
    eval_datasets = eval_data(graph, bind_data(args.eval_data, graph, flag="--eval-data"))
    if env is None or env[0] == 0:
        _describe_inputs(graph, settings, datasets, eval_datasets)
    try:
        result = TorchBackend().train(
            graph,
            plan,
            config,
            nproc=args.nproc,
            planner=planner,
            datasets=datasets,
            schedule=schedule,
            eval_datasets=eval_datasets,
        )
        if result is not None:  # rank 0 (or the parent of --nproc workers)
            used = plan or (made[-1] if made else None)
            calibration = calibrations[-1] if calibrations else Calibration()
            _report(args, result, used, calibration, trace, own_trace)
    finally:
        if own_trace and trace:
            with contextlib.suppress(OSError):
                os.unlink(trace)
    sys.stdout.flush()
    return 0


def _launch(args: argparse.Namespace) -> tuple[Any, int | None]:
    """The torchrun environment (None with ``--nproc`` or outside torchrun) and the number of
    ranks where it is known yet; settles the ZeRO stage that ``--optimizer-sharding off``
    means, and plans for as many devices as there are ranks unless told otherwise."""
    from spindle_dsl.backends.torch import torchrun_env

    if args.zero_stage is None and args.optimizer_sharding == "off" and args.dtype != "bfloat16":
        args.zero_stage = 0  # what runs: plan (and warn about a --plan) for it
    env = None if args.nproc is not None else torchrun_env()
    world = args.nproc if args.nproc is not None else env[1] if env else None
    if world is not None and args.devices is None and args.plan is None:
        args.devices = world  # plan for as many devices as there are ranks
    return env, world


def _compile(args: argparse.Namespace, env: Any) -> Any:
    """The compiled spec with the recipe flags applied (warnings shown on the lead rank only),
    recompiled for the node layout torchrun launched where a plan is to be made here."""
    overrides = train_overrides(args)
    compiled = load_compiled(
        args, show_warnings=env is None or env[0] == 0, train_overrides=overrides
    )
    if env is not None and args.plan is None and args.devices_per_node is None:
        compiled = _for_launched_nodes(args, compiled, lead=env[0] == 0, overrides=overrides)
    return compiled


def _planner(
    args: argparse.Namespace,
    graph: Any,
    schedule: Any,
    made: list[Any],
    calibrations: list[Calibration],
) -> Any:
    """The callback the backend calls when it needs a plan: a plan bundle for a spec with a
    schedule, else one plan, priced by the cost model ``calibrate_train`` picks; each plan
    made is appended to ``made``, and the calibration to ``calibrations``, so the summary can
    set its prediction against the run."""

    def planner() -> Any:
        from spindle_dsl.planner import make_plan
        from spindle_dsl.planner.solver import isolate

        graphs = [p.graph for p in schedule.phases] if schedule is not None else [graph]
        calibrations.append(calibrate_train(args, graphs))
        try:
            if schedule is not None:
                from spindle_dsl.cli.plan_phases import plan_bundle

                made.append(plan_bundle(args, schedule))
                return made[-1]
            made.append(
                make_plan(
                    graph,
                    load_cost_model(args, graph),
                    scheduler=args.scheduler,
                    time_limit_s=args.time_limit,
                    micro_batches=args.micro_batches,
                    zero_stage=args.zero_stage,
                )
            )
            return made[-1]
        finally:  # the solver and planning helper processes are idle while training runs
            isolate.shutdown()

    return planner


def _run_config(args: argparse.Namespace, settings: Any, trace: str | None) -> Any:
    """The backend's ``RunConfig``: the train block's recipe plus the run flags."""
    from spindle_dsl.backends.base import RunConfig

    return RunConfig(
        **settings.run_fields(),
        dtype=args.dtype,
        device=args.run_on,
        checkpoint_dir=args.checkpoint_dir,
        resume=not args.no_resume,
        log_json=args.log_json,
        tensorboard=args.tensorboard,
        trace=trace,
        progress=not args.no_progress,
        hang_timeout_s=args.hang_timeout,
        collective_timeout_s=max(args.hang_timeout + 5.0, 10.0),
        recompute=args.recompute,
        optimizer_sharding=args.optimizer_sharding == "on",
        micro_batches=args.micro_batches,
        zero_stage=args.zero_stage,
    )


def _describe_inputs(
    graph: Any, settings: Any, datasets: dict[str, str], eval_datasets: dict[str, str]
) -> None:
    """Say what data each task trains and evaluates on, and note an evaluation interval that
    has no held-out data to evaluate."""
    describe_data(graph, datasets, settings.seed, eval_datasets)
    if settings.eval_every and not eval_datasets:
        print(
            f"note: eval_every = {settings.eval_every}, but no task has held-out data "
            '(eval_data = "..." in a task, or --eval-data): nothing is evaluated',
            file=sys.stderr,
        )


def _report(
    args: argparse.Namespace,
    result: Any,
    used: Any,
    calibration: Calibration,
    trace: str | None,
    own_trace: bool,
) -> None:
    """Print the run's summary (plan, step times, whether the prediction is calibrated,
    phases, where the time goes against the prediction) and write ``--summary-json``."""
    from spindle_dsl.backends.torch.progress import summary
    from spindle_dsl.plan.model import Plan

    sequential = result.extra.get("baselines", {}).get("sequential_s")
    scheduler = result.extra.get("scheduler", "?")
    print(f"plan: {scheduler}")
    shown = replace(result, trace=None) if own_trace else result  # ours: not the user's
    uncalibrated = calibration.uncalibrated
    print(summary(shown, sequential, calibrated=uncalibrated is None))
    if uncalibrated and result.steps:
        print(uncalibrated_text(calibration, args.spec, args.nproc))
    if "phases" in result.extra:
        from spindle_dsl.backends.torch.phased import phases_summary

        print(phases_summary(result))
    if isinstance(used, Plan) and trace and os.path.exists(trace):
        print(_where_the_time_goes(used, trace))
    if args.summary_json:
        write_atomic(
            args.summary_json, json.dumps(summary_json(result, uncalibrated), indent=1) + "\n"
        )


def _warn_overridden_levers(args: argparse.Namespace, plan: Any) -> None:
    """Say where ``--micro-batches``/``--zero-stage`` override the levers ``--plan`` was made
    with: the run then differs from what the plan predicts (its waves, memory and step time
    were priced for its own levers; plan again with the flag to have them priced)."""
    from spindle_dsl.plan.bundle import PlanBundle

    plans = [p.plan for p in plan.phases] if isinstance(plan, PlanBundle) else [plan]
    asked = {"micro_batches": args.micro_batches, "zero_stage": args.zero_stage}
    flags = {"micro_batches": "--micro-batches", "zero_stage": "--zero-stage"}
    for lever, want in asked.items():
        had = sorted({getattr(p, lever) for p in plans})
        if want is not None and had != [want]:
            print(
                f"warning: {flags[lever]} {want} overrides the plan's {lever} "
                f"{', '.join(map(str, had))}: its predicted step time and memory are for its "
                f"own levers (run without --plan, or `spindle plan {flags[lever]} {want}`, to "
                "have them priced)",
                file=sys.stderr,
            )
    if getattr(args, "tp", None) is not None:
        print(
            f"warning: --tp {args.tp} chooses layouts when planning; --plan runs the layouts the "
            f"plan file holds (`spindle plan --tp {args.tp}` to plan with it)",
            file=sys.stderr,
        )


AUTO_TRACE_STEPS = 500  # longer runs compare only with --trace (spans are kept per step)


def eval_data(graph: Any, flags: dict[str, str]) -> dict[str, str]:
    """Each task's held-out data: ``--eval-data`` where given, else the spec's ``eval_data``
    (a schedule's other phases are not looked at: a task absent from the first phase is
    evaluated only if a flag names it)."""
    return {**{t.name: t.eval_data for t in graph.tasks if t.eval_data}, **flags}


def _trace_path(args: argparse.Namespace, steps: int) -> tuple[str | None, bool]:
    """Where the run writes its measured trace, and whether it is ours (a temporary file made
    so the summary can set the prediction against the run; removed afterwards)."""
    if args.trace:
        return args.trace, False
    # Under torchrun every rank runs this command and all must agree on tracing (it adds a
    # collective at the end): trace there only when asked.
    if steps > AUTO_TRACE_STEPS or args.nproc is None:
        return None, False
    fd, path = tempfile.mkstemp(prefix="spindle-train-", suffix=".json")
    os.close(fd)
    return path, True


def _where_the_time_goes(plan: Any, trace: str) -> str:
    """Predicted against measured, per step term, and the three largest misses (waves and
    MetaOps) of the plan's prediction (``spindle compare`` has them all)."""
    from spindle_dsl.errors import SpindleError
    from spindle_dsl.render.compare import compare, largest_misses, summary_text
    from spindle_dsl.render.measured import load_trace, read_measured

    try:
        rows = compare(plan, read_measured(load_trace(trace), where=trace))
    except SpindleError as exc:
        return f"(no comparison with the prediction: {exc})"
    return summary_text(rows, largest_misses(rows))


def _for_launched_nodes(
    args: argparse.Namespace, compiled: Any, lead: bool, overrides: dict[str, Any] | None = None
) -> Any:
    """Under torchrun, plan for the node layout it launched (LOCAL_WORLD_SIZE per node), and
    say so where the spec's ``devices_per_node`` differs; a plan given with --plan is checked
    against the launch instead (``launch.check_topology``)."""
    from spindle_dsl.backends.torch.launch import launched_topology

    launched = launched_topology()
    graph = compiled.graph
    if launched is None or graph.cluster.devices_per_node == launched.per_node:
        return compiled
    if lead:
        print(
            f"note: planning for the launched topology, {launched.nodes} node(s) x "
            f"{launched.per_node} devices (the spec says {graph.cluster.devices_per_node} "
            f"per node)",
            file=sys.stderr,
        )
    args.devices_per_node = launched.per_node
    return load_compiled(args, show_warnings=False, train_overrides=overrides)


def summary_json(result: Any, uncalibrated: str | None = None) -> dict[str, Any]:
    """The run's headline figures for scripts (bench/train_gpu.sh reads them)."""
    return {
        "scheduler": result.extra.get("scheduler"),
        "world_size": result.world_size,
        "backend": result.backend,
        "steps": len(result.steps),
        "resumed_from": result.resumed_from,
        "measured_step_s": result.measured_step_s,
        "predicted_step_s": result.predicted_step_s,
        # why the prediction is the analytic first guess for CPU workers (null: calibrated by
        # a profile, or a GPU cluster priced by its presets)
        "uncalibrated": uncalibrated,
        "baselines": result.extra.get("baselines", {}),
        "final_loss": dict(result.steps[-1].losses) if result.steps else {},
        # the last held-out losses the run measured (empty without held-out data)
        "final_eval_loss": next(
            (dict(r.eval_losses) for r in reversed(result.steps) if r.eval_losses), {}
        ),
        "optimizer_state_bytes": result.extra.get("optimizer_state_bytes", []),  # per rank
        # a schedule's phases (first step, mix, predicted step time) and the switches made
        **{k: result.extra[k] for k in ("phases", "switches") if k in result.extra},
        "micro_batches": result.extra.get("micro_batches"),
        "zero_stage": result.extra.get("zero_stage"),
        # per rank: measured peak tensor bytes (backends/torch/memory.py says what counts),
        # the plan's predicted peak (null where it has none), and the measured terms at the peak
        "measured_peak_bytes": result.extra.get("measured_peak_bytes", []),
        "predicted_peak_bytes": result.extra.get("predicted_peak_bytes", []),
        "measured_peak_terms": result.extra.get("peak_terms", []),
    }
