"""Baselines, each a valid wave schedule so that it can be placed, timed, drawn and run.

* ``sequential`` (Megatron-LM / DeepSpeed): every MetaOp in turn on all the devices.
* ``distmm``: tasks one after another; inside a task, the MetaOps of one task-level share the
  devices, balanced so that they finish together (DistMM's per-task modality parallelism).
* ``optimus``: every task gets its own device group for the whole iteration, sized by
  greedy marginal gain (Optimus: the next devices go where they cut the most time); tasks run
  side by side, each task's MetaOps in turn on its group. Concurrent tasks with different
  phase lengths are cut into waves at every MetaOp boundary (``waveify``).
"""

from __future__ import annotations

from bisect import bisect_right
from fractions import Fraction

from spindle_dsl.planner.model.problem import OpSpec, Piece, Problem, Schedule
from spindle_dsl.planner.starts.layout import Span, min_max, waveify


def _largest(op: OpSpec, limit: int) -> int:
    return op.largest_at_most(limit)


def sequential_schedule(problem: Problem) -> Schedule:
    waves = tuple((Piece(o.id, 0, o.layers, _largest(o, problem.devices)),) for o in problem.ops)
    return Schedule("sequential", waves)


def balanced(ops: list[OpSpec], devices: int) -> dict[str, int]:
    """Integer allocations of independent ops minimising the longest (``layout.min_max``); each op's
    least allocation where they do not fit side by side (callers split such ops into rounds
    first: ``_chunks``)."""
    return min_max(ops, devices) or {o.id: o.pareto[0] for o in ops}


def task_groups(problem: Problem) -> list[list[OpSpec]]:
    """Tasks in order of first appearance, merged where a dep crosses tasks."""
    parent: dict[str, str] = {}

    def root(t: str) -> str:
        while parent.setdefault(t, t) != t:
            t = parent[t]
        return t

    for o in problem.ops:
        for d in o.deps:
            a, b = root(o.task), root(problem.op(d).task)
            if a != b:
                parent[b] = a
    out: dict[str, list[OpSpec]] = {}
    for o in problem.ops:
        out.setdefault(root(o.task), []).append(o)
    return list(out.values())


def _chunks(ops: list[OpSpec], devices: int) -> list[list[OpSpec]]:
    """Split independent ops into rounds that each fit on the devices at smallest allocation."""
    rounds: list[list[OpSpec]] = [[]]
    used = 0
    for o in ops:
        if rounds[-1] and used + o.pareto[0] > devices:
            rounds.append([])
            used = 0
        rounds[-1].append(o)
        used += o.pareto[0]
    return rounds


def distmm_schedule(problem: Problem) -> Schedule:
    waves: list[tuple[Piece, ...]] = []
    for group in task_groups(problem):
        ids = {o.id for o in group}
        level: dict[str, int] = {}
        for o in group:
            level[o.id] = 1 + max((level[d] for d in o.deps if d in ids), default=-1)
        for lv in range(max(level.values()) + 1):
            ops = [o for o in group if level[o.id] == lv]
            for chunk in _chunks(ops, problem.devices):
                alloc = balanced(chunk, problem.devices)
                waves.append(tuple(Piece(o.id, 0, o.layers, alloc[o.id]) for o in chunk))
    return Schedule("distmm", tuple(waves))


def _task_time(ops: list[OpSpec], n: int) -> float:
    return sum(o.layers * o.t(_largest(o, n)) for o in ops)


def optimus_allocation(groups: list[list[OpSpec]], devices: int) -> list[int]:
    """Greedy marginal gain: one device at a time to the task it speeds up the most.

    Where no task gets faster with one more device, the device goes to the slowest task (a
    larger step may still pay off: curves are flat between listed allocations); that task
    stays the slowest until its next listed allocation, so those steps are taken at once.
    """
    alloc = [max(o.ns[0] for o in g) for g in groups]
    left = devices - sum(alloc)
    # each task's time now and with one more device; only the task that grows changes
    now = [_task_time(g, a) for g, a in zip(groups, alloc, strict=True)]
    gains = [t - _task_time(g, a + 1) for g, a, t in zip(groups, alloc, now, strict=True)]
    while left > 0:
        best = max(range(len(groups)), key=gains.__getitem__)
        step = 1
        if gains[best] <= 0:
            best = max(range(len(groups)), key=now.__getitem__)
            # every step before the task's next listed allocation changes nothing
            above = [m for o in groups[best] if (m := _next_listed(o, alloc[best])) is not None]
            step = max(1, min(left, min(above) - alloc[best] - 1)) if above else left
        alloc[best] += step
        left -= step
        g = groups[best]
        now[best] = _task_time(g, alloc[best])
        gains[best] = now[best] - _task_time(g, alloc[best] + 1)
    return alloc


def _next_listed(op: OpSpec, n: int) -> int | None:
    """The least listed allocation of ``op`` above ``n``, if any."""
    i = bisect_right(op.ns, n)
    return op.ns[i] if i < len(op.ns) else None


def _chain_spans(chains: list[tuple[list[OpSpec], int]]) -> list[Span]:
    """Each chain's ops back to back on its ``n`` devices, all chains from time 0."""
    spans: list[Span] = []
    for ops, n in chains:
        t = Fraction(0)
        for o in ops:
            spans.append(Span.after(o, _largest(o, n), t))
            t = spans[-1].end
    return spans


def optimus_schedule(problem: Problem) -> Schedule:
    groups = task_groups(problem)
    waves: list[tuple[Piece, ...]] = []
    # more tasks than devices: run them in rounds that fit side by side
    rounds: list[list[list[OpSpec]]] = [[]]
    used = 0
    for g in groups:
        need = max(o.ns[0] for o in g)
        if rounds[-1] and used + need > problem.devices:
            rounds.append([])
            used = 0
        rounds[-1].append(g)
        used += need
    for batch in rounds:
        alloc = optimus_allocation(batch, problem.devices)
        waves.extend(waveify(_chain_spans(list(zip(batch, alloc, strict=True)))))
    return Schedule("optimus", tuple(waves))


BASELINES = {
    "sequential": sequential_schedule,
    "distmm": distmm_schedule,
    "optimus": optimus_schedule,
}
