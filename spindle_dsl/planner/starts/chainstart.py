"""A start for the ``milp`` scheduler that runs the head of the critical chain alone first.

Why. Where one task's chain of MetaOps spans the MetaLevels and sets the iteration (a vision
tower, its resampler, then the language model it feeds), the best waves a long exact solve
finds run the chain's head alone on all the devices it can use, then its last MetaOp beside
the other tasks (``bench/wave_optimum.py`` on flamingo_like at 16 devices: a 60 s solve of
the wave MILP over every allocation). The head scales well, so running it wide costs few
device-seconds and starts the long tail early; the other tasks fill the devices beside the
tail. No other start has
that shape: the level starts share the first level's devices among every task's encoders,
and the task layouts give the chain one group from start to end.

How. The critical chain is the longest path with every MetaOp at its quickest allocation
(``bounds.critical_chain``, the path the critical-path bound measures). Each MetaOp of its
head (all but the last, up to the first with an input from off the chain, which would have
to run first) runs all its layers in a wave of its own on its quickest allocation; the rest,
with those deps met, is laid out task-parallel (``taskpar``), which gives the chain's tail a
group sized with the other tasks'. The scheduler improves and polishes it as every start;
where it is not the quickest it is simply not kept.
"""

from __future__ import annotations

from dataclasses import replace

from spindle_dsl.planner.bound.area import critical_chain
from spindle_dsl.planner.model.problem import Piece, Problem, Schedule
from spindle_dsl.planner.starts.taskpar import task_parallel_schedule


def chain_head(problem: Problem) -> list[str]:
    """The critical chain but its last MetaOp, cut before the first MetaOp with an input
    from off the chain (that input would have to run first): what runs alone."""
    head: list[str] = []
    for op_id in critical_chain(problem)[:-1]:
        if not set(problem.op(op_id).deps) <= set(head):
            break
        head.append(op_id)
    return head


def chain_head_schedule(problem: Problem) -> Schedule | None:
    """The start of the module docstring; None where the chain has no head to run alone."""
    head = chain_head(problem)
    if not head:
        return None
    done = set(head)
    waves = tuple(
        (Piece(i, 0, problem.op(i).layers, problem.op(i).fastest_within(problem.devices)),)
        for i in head
    )
    rest = tuple(
        replace(o, deps=tuple(d for d in o.deps if d not in done))
        for o in problem.ops
        if o.id not in done
    )
    tail = task_parallel_schedule(Problem(rest, problem.devices, problem.lanes))
    return Schedule("chain", waves + tail.waves)
