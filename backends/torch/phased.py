"""A run that follows a schedule of mixes: its phases, and the parts no phase is using now.

A phase is (first step, mix, MetaGraph, plan). A run without a schedule is a run of one phase,
so the worker has a single path. Between phases a task may leave (``caption_only`` drops
``transcribe``); its parts are then *parked*: the first rank that held each keeps its weights
and its whole optimizer state, untouched, until a later phase trains the task again and the
switch (``switch.py``) hands them to their new holders; they wait in host memory, so the
device keeps its room for the phase that runs. Every rank knows where each parked
part is (``Parked.at``); only that rank holds it (``Parked.mine``). A checkpoint writes parked
parts too, and resuming spreads them over the ranks of the new run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.phases import MixSchedule
from spindle_dsl.plan.bundle import PlanBundle
from spindle_dsl.plan.model import Plan

from . import checkpoint
from .params import build_part
from .parts import Part


@dataclass(frozen=True)
class RunPhase:
    """From ``first_step`` completed optimizer steps on, run ``plan`` of ``graph``."""

    first_step: int
    mix: str | None
    graph: MetaGraph
    plan: Plan


def run_phases(
    graph: MetaGraph, plan: Plan | PlanBundle, schedule: MixSchedule | None
) -> tuple[RunPhase, ...]:
    """The phases a run follows: one (``graph``, ``plan``) without a schedule; with one, the
    bundle's plans matched to the schedule's graphs, phase by phase."""
    if schedule is None:
        if isinstance(plan, PlanBundle):
            raise ExecutionError(
                "a plan bundle needs a spec with a schedule (and no --mix); pass one phase's "
                "plan, or the spec the bundle was made for"
            )
        return (RunPhase(0, graph.mix, graph, plan),)
    if not isinstance(plan, PlanBundle):
        raise ExecutionError(
            "this spec has a schedule: run it with the plan bundle `spindle plan` writes for "
            "it (or plan nothing and let `spindle train` plan every phase), or pass --mix MIX "
            "to train one mix"
        )
    want = [(p.first_step, p.mix) for p in schedule.phases]
    have = [(p.first_step, p.mix) for p in plan.phases]
    if want != have:
        raise ExecutionError(
            f"the plan bundle's phases {have} are not the spec's schedule {want}; re-plan it"
        )
    return tuple(
        RunPhase(p.first_step, p.mix, p.graph, b.plan)
        for p, b in zip(schedule.phases, plan.phases, strict=True)
    )


def phase_index(phases: Sequence[RunPhase], step: int) -> int:
    """The phase that runs 0-based step ``step``."""
    return max(i for i, p in enumerate(phases) if p.first_step <= step)


def module_graph(phases: Sequence[RunPhase], module: str) -> MetaGraph:
    """A phase graph that has ``module`` (to build one of its parts from)."""
    for p in phases:
        if any(m.name == module for m in p.graph.modules):
            return p.graph
    raise ExecutionError(f"internal: no phase of the run has module {module}")


@dataclass
class ParkedPart:
    module: nn.Module
    state: Any  # the whole optimizer state by parameter name, as ``part_state`` gives it


@dataclass
class Parked:
    """Parts the current phase does not use: where they are, and those this rank keeps."""

    at: dict[Part, int] = field(default_factory=dict)  # on every rank
    mine: dict[Part, ParkedPart] = field(default_factory=dict)  # on the rank in ``at``

    def parts(self) -> tuple[Part, ...]:
        return tuple(sorted(self.at))

    def for_checkpoint(self) -> dict[Part, tuple[nn.Module, Any]]:
        return {p: (k.module, k.state) for p, k in self.mine.items()}

    def bytes_here(self) -> int:
        """Parameter bytes this rank keeps parked (its whole optimizer state besides)."""
        return sum(t.numel() * t.element_size() for k in self.mine.values()
                   for t in k.module.parameters())  # fmt: skip


def resume_parked(
    info: checkpoint.CheckpointInfo,
    active: set[Part],
    phases: Sequence[RunPhase],
    rank: int,
    world_size: int,
    *,
    seed: int,
    dtype: torch.dtype,
) -> Parked:
    """The checkpoint's parts that the resuming phase does not use, parked again: the ``i``-th
    (in the manifest's order) on rank ``i mod world_size``, whatever ranks kept them before."""
    keys = [k for k in info.manifest.get("parts", ()) if Part.from_key(k) not in active]
    parked = Parked()
    for i, key in enumerate(keys):
        part = Part.from_key(key)
        parked.at[part] = i % world_size
        if parked.at[part] != rank:
            continue
        module = build_part(module_graph(phases, part.module), part, seed, dtype, "cpu")
        record = checkpoint.read_part(info, part)
        checkpoint.load_params(info, part, module, record)
        parked.mine[part] = ParkedPart(module, record["optimizer"])
    return parked


def phases_summary(result: Any) -> str:
    """Per phase of a scheduled run (``result.extra``): the steps it ran (numbered from 1, as
    the log numbers them), its mix, measured and predicted step time, and the switch into it."""
    phases = result.extra["phases"]
    switch_s = {s["step"]: s["seconds"] for s in result.extra.get("switches", ())}
    lines = [
        f"{'phase':>5}  {'steps':<9} {'mix':<16} {'measured':>10} {'predicted':>10} "
        f"{'switch into it':>14}"
    ]
    for i, p in enumerate(phases):
        end = phases[i + 1]["first_step"] if i + 1 < len(phases) else None
        ran = sorted(
            r.seconds
            for r in result.steps
            if r.step > p["first_step"] and (end is None or r.step <= end)
        )
        measured = f"{ran[len(ran) // 2]:.4f}s" if ran else "-"
        into = switch_s.get(p["first_step"])
        lines.append(
            f"{i + 1:>5}  {p['first_step'] + 1}-{'' if end is None else end:<{7}} "
            f"{p['mix']:<16} {measured:>10} {p['predicted_step_s']:>9.4f}s "
            f"{'-' if into is None else f'{into:.3f}s':>14}"
        )
    return "\n".join(lines)
