"""One plan's model on one rank, and one optimizer step of it.

A ``Trainer`` owns what a plan decides on a rank: the compiled schedule, the parts the rank
holds, their AdamW state, the gradient groups and the step executor. Keeping it apart from the
run loop lets one set of worker processes hold several plans of the same spec side by side
(each with its own fresh model) and step them in turn, which is how the benchmark compares
plans on the very same processes, under the same machine load.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan

from ..base import RunConfig, StepRecord
from .data import TaskData
from .executor import StepExecutor
from .grads import GradReducer
from .optim import make_optimizer
from .params import DTYPES, PartStore
from .schedule import build_schedule
from .trace import Tracer


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
    ):
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
        self.store = PartStore(graph, self.schedule.parts_of(rank), config.seed, dtype, device)
        self.opt = make_optimizer(
            (t for _, _, t in self.store.trainable()),
            lr=config.lr,
            weight_decay=config.weight_decay,
            betas=config.betas,
            eps=config.eps,
        )
        self.reducer = GradReducer(self.schedule, rank, self.store)
        data = TaskData(graph, config.seed, datasets, dtype, device)
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
        )
        self.tasks = [t.name for t in graph.tasks if t.batch > 0]

    def step(self, step: int) -> StepRecord:
        """Forward, backward, gradient reduction and AdamW for step ``step`` (0-based); the
        record carries each task's loss summed over all ranks, and this rank's wall time."""
        t0 = time.perf_counter()
        with self.tracer.span(f"step {step + 1}", "step"):
            shares = self.executor.run(step)
            self.beat(f"step {step + 1} gradient reduction")
            with self.tracer.span("reduce gradients", "reduce"):
                self.reducer.reduce()
            with self.tracer.span("optimizer", "optimizer"):
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            totals = torch.tensor(
                [shares[t] for t in self.tasks], dtype=torch.float64, device=self.device
            )
            dist.all_reduce(totals)  # also lines the ranks up, so step times compare
        losses = tuple(zip(self.tasks, totals.tolist(), strict=True))
        return StepRecord(step + 1, losses, time.perf_counter() - t0)
