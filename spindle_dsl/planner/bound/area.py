"""A proven lower bound on any wave plan's compute time, and the paper's reference point.

``lower_bound_s`` = max(area bound, critical-path bound), both valid for every plan the
format allows:

* area: waves run back to back and entries of a wave use disjoint devices, so N times the sum
  of wave durations is at least the device-seconds of all entries, and an entry of k layers
  of m on n devices costs k * n * T_m(n) >= k * min_n n T_m(n). Where a node's devices share
  fewer cores than they number (CPU workers), a wave's phase takes at least its work over the
  cores (``cost.step.shared_makespan``), so N becomes the cluster's cores (``lanes``);
* critical path: the MetaOps of a dependency chain occupy disjoint sets of waves (deps in
  strictly earlier waves), and each wave lasts at least as long as its entries, so the sum
  of durations is at least sum over the chain of L_m * min_n T_m(n).

Transfers and gradient sync only add time, so the bound holds for ``iteration_s`` too.
``level_reference_s`` (sum over MetaLevels of the continuous optimum) is not a bound once
MetaOps cross levels; it is the yardstick the paper's allocator aims at.
"""

from __future__ import annotations

from spindle_dsl.planner.model.allocator import level_optimum
from spindle_dsl.planner.model.problem import Problem


def area_bound_s(problem: Problem, lanes: int | None = None) -> float:
    """The area bound; ``lanes``: how many devices' work the cluster advances at once, where
    devices share cores (``StepModel.lanes``; default: ``problem.lanes``, else every device)."""
    return sum(o.layers * o.min_area for o in problem.ops) / (
        lanes or problem.lanes or problem.devices
    )


def _longest_paths(problem: Problem) -> tuple[dict[str, float], dict[str, str | None]]:
    """Per op, the longest dependency path ending with it, each op at its least time, and
    the dep that path comes through (None at a source)."""
    longest: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for o in problem.ops:  # a topological order
        dep = max(o.deps, key=lambda d: longest[d], default=None)
        longest[o.id] = o.layers * o.min_time + (longest[dep] if dep is not None else 0.0)
        via[o.id] = dep
    return longest, via


def critical_path_s(problem: Problem) -> float:
    return max(_longest_paths(problem)[0].values(), default=0.0)


def critical_chain(problem: Problem) -> list[str]:
    """The MetaOps of the critical path (the longest, each op at its least time), from
    source to sink; empty without MetaOps."""
    longest, via = _longest_paths(problem)
    node = max(longest, key=lambda i: longest[i], default=None)
    chain: list[str] = []
    while node is not None:
        chain.append(node)
        node = via[node]
    return chain[::-1]


def lower_bound_s(problem: Problem, lanes: int | None = None) -> float:
    return max(area_bound_s(problem, lanes), critical_path_s(problem))


def level_reference_s(problem: Problem) -> float:
    """The paper's reference: the sum over MetaLevels of each level's continuous optimum, on
    the cores where the devices share fewer (``Problem.lanes``: no more run at once)."""
    return sum(
        level_optimum([problem.op(i) for i in lv], problem.lanes or problem.devices).completion_s
        for lv in problem.levels
    )
