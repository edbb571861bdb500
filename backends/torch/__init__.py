"""The PyTorch backend: a wave plan executed as real training on torch.distributed.

Public API::

    from spindle_dsl.backends.torch import TorchBackend, DictDataset, ReferenceModel
    result = TorchBackend().train(graph, plan, RunConfig(steps=5), nproc=4,
                                  datasets={"caption": my_dataset})

With ``nproc`` it spawns local workers (gloo on CPU, NCCL on GPUs); under ``torchrun`` each
process calls ``train`` without ``nproc`` and becomes the rank the environment names; with
neither it runs as a single rank. Only rank 0 gets a ``RunResult`` back (others get None).

The runtime keeps the memory the planner counts on: AdamW state is sharded over the ranks that
hold each part (``RunConfig.optimizer_sharding``, ZeRO-1, ``zero.py``), and the MetaOps the plan
marks recompute their activations in backward (``RunConfig.recompute``); what each rank held
of the optimizer state comes back in ``result.extra["optimizer_state_bytes"]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.phases import MixSchedule
from spindle_dsl.plan.bundle import PlanBundle
from spindle_dsl.plan.model import Plan

from ..base import Backend, RunConfig, RunResult
from .data import DictDataset
from .launch import LaunchTopology, check_topology, launched_topology
from .reference import ReferenceModel

__all__ = ["DictDataset", "ReferenceModel", "TorchBackend", "torchrun_env"]


def torchrun_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when a launcher such as torchrun set them, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise ExecutionError("RANK, WORLD_SIZE and LOCAL_RANK must be integers") from None
    return rank, world, local


class TorchBackend(Backend):
    name = "torch"

    def train(
        self,
        graph: MetaGraph,
        plan: Plan | PlanBundle | None,
        config: RunConfig,
        *,
        nproc: int | None = None,
        datasets: Mapping[str, Any] | None = None,
        planner: Callable[[], Plan | PlanBundle] | None = None,
        compare: tuple[Plan | tuple[Plan, Mapping[str, Any]], ...] = (),
        schedule: MixSchedule | None = None,
        eval_datasets: Mapping[str, Any] | None = None,
    ) -> RunResult | None:
        """Train; ``plan`` None asks ``planner`` for one (once, on rank 0 or in the parent).

        ``schedule``: the spec's schedule of mixes (``graph`` is its first phase's); ``plan``
        is then a ``PlanBundle`` with a plan per phase, and the run switches plans in place at
        each phase's first step (``switch.py``).

        ``compare`` adds plans of the same spec that the same processes train side by side,
        each a fresh model, one step of each after every step of ``plan``; their step records
        come back in ``result.extra["compared"]`` (the benchmark's fair comparison). An item
        may be ``(plan, changes)`` to also change ``recompute``, ``optimizer_sharding`` or
        ``grad_collective`` for that model (the same plan with and without sharding, say).

        ``eval_datasets``: held-out data by task, bound as ``datasets`` is (None: each task's
        ``eval_data`` in the spec), evaluated every ``config.eval_every`` steps and after the
        last; a task the run does not train is an error."""
        from .launch import spawn
        from .phased import run_phases
        from .worker import Job, check_eval_tasks, compare_item, preflight, run_rank

        compare = tuple(compare)
        for item in compare:
            compare_item(item)  # refuse a bad item before anything starts
        if compare and schedule is not None:
            raise ExecutionError("plans are compared on runs of one mix, not on a schedule")
        if config.tensorboard:
            from .steplog import summary_writer_class

            summary_writer_class()  # installed, or a clear error before anything starts
        graphs = [p.graph for p in schedule.phases] if schedule is not None else [graph]
        if eval_datasets is None:
            eval_datasets = {t.name: t.eval_data for g in graphs for t in g.tasks if t.eval_data}
        eval_datasets = dict(eval_datasets)
        check_eval_tasks(graphs, eval_datasets)

        if nproc is not None:
            if plan is None:
                if planner is None:
                    raise ExecutionError("no plan given and no planner to make one")
                plan = planner()
            for r in run_phases(graph, plan, schedule):
                preflight(r.graph, r.plan, nproc, datasets, eval_datasets)
            for p in (compare_item(c)[0] for c in compare):
                preflight(graph, p, nproc, datasets)
            job = Job(graph, plan, config, dict(datasets or {}), tuple(compare), schedule,
                      eval_datasets)  # fmt: skip
            return spawn(job, nproc, hang_timeout_s=config.hang_timeout_s)
        env = torchrun_env()
        rank, world, local = env if env is not None else (0, 1, 0)
        launched = launched_topology() if env is not None else None
        if launched is not None:  # the plans must be for the node layout torchrun started
            for p in (plan, *(compare_item(c)[0] for c in compare)):
                for one in _plans_in(p):
                    check_topology(one.cluster, launched)
            if planner is not None:
                planner = _checked(planner, launched)
        job = Job(graph, plan, config, dict(datasets or {}), tuple(compare), schedule,
                  eval_datasets)  # fmt: skip
        return run_rank(job, rank, world, local, planner=planner)


def _plans_in(plan: Plan | PlanBundle | None) -> tuple[Plan, ...]:
    """The plans a run may execute: one, a bundle's phases, or none yet."""
    if plan is None:
        return ()
    if isinstance(plan, PlanBundle):
        return tuple(phase.plan for phase in plan.phases)
    return (plan,)


def _checked(
    planner: Callable[[], Plan | PlanBundle], launched: LaunchTopology
) -> Callable[[], Plan | PlanBundle]:
    def plan() -> Plan | PlanBundle:
        made = planner()
        for one in _plans_in(made):
            check_topology(one.cluster, launched, "the plan just made")
        return made

    return plan
