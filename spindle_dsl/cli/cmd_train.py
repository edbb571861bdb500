"""``spindle train``: run a wave plan as real training on torch.distributed.

Three ways to start it: ``--nproc N`` spawns N local worker processes (gloo on CPU, NCCL on
GPUs); under ``torchrun`` (one or many nodes) every process runs this command and takes its
rank from RANK, LOCAL_RANK and WORLD_SIZE; with neither, a spec whose cluster is ``cpu``
devices spawns one worker per device. Without ``--plan`` it plans first (``--scheduler``,
default: the default scheduler) for exactly as many devices as there are ranks.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from spindle_dsl.atomic import write_atomic
from spindle_dsl.cli.common import add_spec_arguments, load_cost_model, load_graph
from spindle_dsl.errors import ExecutionError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from spindle_dsl.planner import DEFAULT_TIME_LIMIT_S, SCHEDULERS

    add_spec_arguments(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--plan", metavar="PLAN.json", help="run this plan (from `spindle plan`)")
    source.add_argument(
        "--scheduler",
        default="default",
        choices=SCHEDULERS,
        help="plan with this scheduler or baseline first (default: %(default)s)",
    )
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="S")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps (default: 10)")
    parser.add_argument("--nproc", type=int, help="spawn this many local worker processes")
    parser.add_argument("--log-json", metavar="FILE", help="one JSON line per step")
    parser.add_argument("--checkpoint-dir", metavar="DIR", help="checkpoint here (and resume)")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, metavar="K", help="also every K steps"
    )
    parser.add_argument(
        "--no-resume", action="store_true", help="start afresh even if DIR has a checkpoint"
    )
    parser.add_argument("--trace", metavar="FILE.json", help="write a measured Chrome trace")
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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
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


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.backends.base import RunConfig
    from spindle_dsl.backends.torch import TorchBackend, torchrun_env
    from spindle_dsl.backends.torch.progress import summary
    from spindle_dsl.plan.model import Plan

    env = None if args.nproc is not None else torchrun_env()
    world = args.nproc if args.nproc is not None else env[1] if env else None
    if world is not None and args.devices is None and args.plan is None:
        args.devices = world  # plan for as many devices as there are ranks
    graph = load_graph(args, show_warnings=env is None or env[0] == 0)
    if env is not None and args.plan is None and args.devices_per_node is None:
        graph = _for_launched_nodes(args, graph, lead=env[0] == 0)
    if world is None:
        if graph.cluster.device.name != "cpu":
            raise ExecutionError(
                f"the spec's cluster has {graph.cluster.devices} {graph.cluster.device.name} "
                f"devices: start the run with torchrun, or pass --nproc N to spawn local workers"
            )
        world = graph.cluster.devices
        args.nproc = world

    def planner() -> Plan:
        from spindle_dsl.planner import make_plan

        return make_plan(
            graph,
            load_cost_model(args, graph),
            scheduler=args.scheduler,
            time_limit_s=args.time_limit,
        )

    plan = Plan.read(args.plan) if args.plan else None
    config = RunConfig(
        steps=args.steps,
        seed=args.seed,
        lr=args.lr,
        dtype=args.dtype,
        device=args.run_on,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        resume=not args.no_resume,
        log_json=args.log_json,
        trace=args.trace,
        progress=not args.no_progress,
        hang_timeout_s=args.hang_timeout,
        collective_timeout_s=max(args.hang_timeout + 5.0, 10.0),
        recompute=args.recompute,
        optimizer_sharding=args.optimizer_sharding == "on",
    )
    result = TorchBackend().train(graph, plan, config, nproc=args.nproc, planner=planner)
    if result is not None:  # rank 0 (or the parent of --nproc workers)
        sequential = result.extra.get("baselines", {}).get("sequential_s")
        scheduler = result.extra.get("scheduler", "?")
        print(f"plan: {scheduler}")
        print(summary(result, sequential))
        if args.summary_json:
            write_atomic(args.summary_json, json.dumps(summary_json(result), indent=1) + "\n")
    sys.stdout.flush()
    return 0


def _for_launched_nodes(args: argparse.Namespace, graph: Any, lead: bool) -> Any:
    """Under torchrun, plan for the node layout it launched (LOCAL_WORLD_SIZE per node), and
    say so where the spec's ``devices_per_node`` differs; a plan given with --plan is checked
    against the launch instead (``launch.check_topology``)."""
    from spindle_dsl.backends.torch.launch import launched_topology

    launched = launched_topology()
    if launched is None or graph.cluster.devices_per_node == launched.per_node:
        return graph
    if lead:
        print(
            f"note: planning for the launched topology, {launched.nodes} node(s) x "
            f"{launched.per_node} devices (the spec says {graph.cluster.devices_per_node} "
            f"per node)",
            file=sys.stderr,
        )
    args.devices_per_node = launched.per_node
    return load_graph(args, show_warnings=False)


def summary_json(result: Any) -> dict[str, Any]:
    """The run's headline figures for scripts (bench/train_gpu.sh reads them)."""
    return {
        "scheduler": result.extra.get("scheduler"),
        "world_size": result.world_size,
        "backend": result.backend,
        "steps": len(result.steps),
        "resumed_from": result.resumed_from,
        "measured_step_s": result.measured_step_s,
        "predicted_step_s": result.predicted_step_s,
        "baselines": result.extra.get("baselines", {}),
        "final_loss": dict(result.steps[-1].losses) if result.steps else {},
        "optimizer_state_bytes": result.extra.get("optimizer_state_bytes", []),  # per rank
    }
