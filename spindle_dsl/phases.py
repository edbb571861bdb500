"""A schedule of mixes as the later stages see it: phases, each a MetaGraph from a step on.

A MetaGraph is one mix frozen into numbers; a schedule is a sequence of them. Phase ``k``
applies from ``first_step`` completed optimizer steps on (0-based step index ``first_step``
is its first step) until the next phase's ``first_step``; the last phase runs to the end of
training. Every phase's graph comes from the same spec, with the same
parameters (input stages are sized for every phase), so a run can move from one to the next.

Data positions live here too because the runtime and the single-process reference must agree
on them exactly: a task's samples are numbered from 0 in the order the run consumes them, so
step ``s`` reads the task's samples from the sum of its batches over the steps before ``s``
(steps of phases where the task is absent take nothing).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from functools import cached_property

from spindle_dsl.metagraph import MetaGraph


@dataclass(frozen=True)
class Phase:
    """From ``first_step`` completed optimizer steps on, train ``graph`` (the mix ``mix``)."""

    first_step: int
    mix: str
    graph: MetaGraph

    def batch(self, task: str) -> int:
        """The task's batch in this phase (0 when the mix leaves it out)."""
        return next((t.batch for t in self.graph.tasks if t.name == task), 0)


@dataclass(frozen=True)
class MixSchedule:
    """The phases of a run, by increasing ``first_step``, the first at step 0."""

    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        steps = [p.first_step for p in self.phases]
        assert steps and steps[0] == 0, f"a schedule starts at step 0, got {steps}"
        assert all(a < b for a, b in itertools.pairwise(steps)), steps

    @classmethod
    def single(cls, graph: MetaGraph) -> MixSchedule:
        """A run without a schedule: one phase, the graph's mix, from step 0."""
        return cls((Phase(0, graph.mix or "-", graph),))

    def __len__(self) -> int:
        return len(self.phases)

    def index_at(self, step: int) -> int:
        """The index of the phase that runs 0-based step ``step``."""
        return bisect.bisect_right([p.first_step for p in self.phases], step) - 1

    def at(self, step: int) -> Phase:
        return self.phases[self.index_at(step)]

    def end_of(self, index: int, steps: int) -> int:
        """The step after phase ``index``'s last (``steps`` for the last phase)."""
        return self.phases[index + 1].first_step if index + 1 < len(self.phases) else steps

    @cached_property
    def task_names(self) -> tuple[str, ...]:
        """Every task some phase trains, in the order the phases first name them."""
        out: list[str] = []
        for p in self.phases:
            out.extend(t.name for t in p.graph.tasks if t.name not in out and t.batch > 0)
        return tuple(out)

    def first_sample(self, task: str, step: int) -> int:
        """The index of ``task``'s first sample at 0-based step ``step``: the samples its
        batches took over every step before."""
        total = 0
        for i, p in enumerate(self.phases):
            if p.first_step >= step:
                break
            end = min(self.end_of(i, step), step)
            total += (end - p.first_step) * p.batch(task)
        return total
