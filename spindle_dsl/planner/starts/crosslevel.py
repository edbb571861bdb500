"""Starts for the ``milp`` scheduler that cross MetaLevel boundaries: tasks side by side with
their branches side by side (``task_parallel_schedule``), the critical chain's head first
(``chain_head_schedule``), and CPA list scheduling on a time axis (``cpa_schedule``).

The ``optimus`` layout (``baselines.optimus_schedule``) gives every task a device group and
runs the task's MetaOps one after another on it, and sizes the groups by greedy marginal
gain. Two things keep it from the LP bound's shape on many-task jobs (``lp_bound``; encdec7
at 128 devices, a row of ``bench/plan_quality.py``'s gap table): a task with independent
branches (doc_vqa's vision and text encoders, which only meet in the decoder) runs them in
turn on its whole group, where the LP runs them at once on a few devices each; and devices go
where they save the most seconds, not to the task that ends last, so the critical chain
(transcribe's speech encoder, 24 layers on 1,500 tokens) gets fewer devices than the LP gives
it.

This layout fixes both and stays a simple layout: each task's MetaOps are cut into task
levels (an op's level is one more than its deepest dep inside the task), each level's ops run
side by side on the task's group, split min-max; and the groups are sized min-max too: the
least completion time C at which every task, on the least group that ends it within C, fits
in the devices (a bisection on C, and on each task's group size), devices left over going to
the task that ends last. The spans are cut into waves at every boundary
(``layout.waveify``) and, as every start, improved and polished by the scheduler.

Cost: bisections over pareto allocations only, so 50 tasks on 65,536 devices take about as
long as the ``optimus`` layout (handing out devices one at a time takes far longer there).

A start for the ``milp`` scheduler that runs the head of the critical chain alone first.

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
(``floors.critical_chain``, the path the critical-path bound measures). Each MetaOp of its
head (all but the last, up to the first with an input from off the chain, which would have
to run first) runs all its layers in a wave of its own on its quickest allocation; the rest,
with those deps met, is laid out task-parallel (``task_parallel_schedule``), which gives the
chain's tail a group sized with the other tasks'. The scheduler improves and polishes it as
every start; where it is not the quickest it is simply not kept.

Cross-level list scheduling of malleable MetaOps on a time axis, then cut into waves.

A second route to a cross-level plan, independent of MetaLevels: the classic CPA approach
to malleable tasks with precedences (Radulescu & van Gemund, "A low-cost approach towards
mixed task and data parallel scheduling", ICPP 2001):

1. allocation: start every MetaOp on its smallest allocation; while the critical path is
   longer than the average area (device-seconds / N), give the critical-path MetaOp with the
   best time saved per extra device-second its next faster allocation;
2. list scheduling: at each event, start ready MetaOps (inputs done) by decreasing bottom
   level (longest time to a sink) whenever their allocation fits the free devices.

``waveify`` then cuts the time axis at every MetaOp end into waves, splitting each MetaOp's
layers between waves by rounding its cumulative progress at the cuts, so the result obeys
the wave format (disjoint devices per wave, deps in strictly earlier waves).
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from fractions import Fraction

from spindle_dsl.planner.bound.floors import critical_chain
from spindle_dsl.planner.model.problem import OpSpec, Piece, Problem, Schedule
from spindle_dsl.planner.starts.baselines import task_groups
from spindle_dsl.planner.starts.layout import Span, least_fitting, min_max, waveify

_LEFTOVER_ROUNDS = 8  # per task: hand-outs of devices left over after the bisection


def task_levels(group: list[OpSpec]) -> list[list[OpSpec]]:
    """A task's MetaOps by depth inside the task (deps outside it do not count)."""
    ids = {o.id for o in group}
    depth: dict[str, int] = {}
    for o in group:  # ``problem.ops`` is in a topological order
        depth[o.id] = 1 + max((depth[d] for d in o.deps if d in ids), default=-1)
    levels: list[list[OpSpec]] = [[] for _ in range(max(depth.values()) + 1)]
    for o in group:
        levels[depth[o.id]].append(o)
    return levels


def _seconds(op: OpSpec, n: int) -> float:
    return op.layers * op.t(n)


def split_level(ops: list[OpSpec], devices: int) -> dict[str, int] | None:
    """Min-max allocations of independent ops side by side on ``devices`` (``layout.min_max``); None
    if they do not fit side by side at their least."""
    if len(ops) == 1:
        o = ops[0]
        return {o.id: o.fastest_within(devices)} if o.pareto[0] <= devices else None
    return min_max(ops, devices)


class TaskLayout:
    """One task's levels and its running time per group size (memoised: the bisections ask
    for the same sizes again and again)."""

    def __init__(self, group: list[OpSpec]):
        self.levels = task_levels(group)
        self.by_id = {o.id: o for o in group}
        self.least = max(o.pareto[0] for level in self.levels for o in level)
        self._memo: dict[int, float] = {}

    def layout(self, devices: int) -> list[list[dict[str, int]]]:
        """Per level, rounds of ops side by side (ops that do not fit side by side at their
        least allocations run in several rounds), each round split min-max."""
        out = []
        for level in self.levels:
            split = split_level(level, devices)
            if split is not None:
                out.append([split])
            else:  # one op at a time
                out.append([{o.id: o.fastest_within(devices)} for o in level])
        return out

    def seconds(self, devices: int) -> float:
        if devices not in self._memo:
            self._memo[devices] = sum(
                max(_seconds(self.by_id[i], n) for i, n in alloc.items())
                for rounds in self.layout(devices)
                for alloc in rounds
            )
        return self._memo[devices]

    def least_within(self, seconds: float, devices: int) -> int | None:
        """The least group size (up to ``devices``) on which the task ends within ``seconds``,
        by bisection: a task's time falls as its group grows, except where a level's ops
        first fit side by side, where the size found may not be the least."""
        if self.seconds(devices) > seconds:
            return None
        lo, hi = self.least, devices
        while lo < hi:
            mid = (lo + hi) // 2
            if self.seconds(mid) <= seconds:
                hi = mid
            else:
                lo = mid + 1
        return lo


def _sizes_within(tasks: list[TaskLayout], seconds: float, devices: int) -> list[int] | None:
    """Each task's least group that ends it within ``seconds``; None if some task cannot."""
    out = []
    for t in tasks:
        n = t.least_within(seconds, devices)
        if n is None:
            return None
        out.append(n)
    return out


def group_sizes(tasks: list[TaskLayout], devices: int) -> list[int]:
    """Min-max group sizes of tasks side by side (module docstring)."""

    def fit(seconds: float) -> list[int] | None:
        got = _sizes_within(tasks, seconds, devices)
        return got if got is not None and sum(got) <= devices else None

    lo = max(t.seconds(devices) for t in tasks)
    hi = max(t.seconds(t.least) for t in tasks)
    sizes = least_fitting(lo, hi, fit, [t.least for t in tasks], rounds=30, tolerance=1e-9)
    free = devices - sum(sizes)
    for _ in range(_LEFTOVER_ROUNDS * len(tasks)):
        if free <= 0:
            break
        slow = max(range(len(tasks)), key=lambda i: tasks[i].seconds(sizes[i]))
        grown = tasks[slow].least_within(tasks[slow].seconds(sizes[slow]) * (1 - 1e-9),
                                         sizes[slow] + free)  # fmt: skip
        if grown is None:
            break
        free -= grown - sizes[slow]
        sizes[slow] = grown
    return sizes


def task_parallel_schedule(problem: Problem) -> Schedule:
    """Tasks side by side on min-max groups, each task's independent MetaOps side by side
    on its group (module docstring). Tasks that do not fit side by side at their least
    groups run in rounds, as in the ``optimus`` layout."""
    tasks = [TaskLayout(g) for g in task_groups(problem)]
    rounds: list[list[TaskLayout]] = [[]]
    used = 0
    for t in tasks:
        if rounds[-1] and used + t.least > problem.devices:
            rounds.append([])
            used = 0
        rounds[-1].append(t)
        used += t.least
    waves = []
    for batch in rounds:
        spans: list[Span] = []
        for task, n in zip(batch, group_sizes(batch, problem.devices), strict=True):
            at = Fraction(0)
            for rounds_of_level in task.layout(n):
                for alloc in rounds_of_level:
                    row = [Span.after(task.by_id[i], m, at) for i, m in alloc.items()]
                    spans.extend(row)
                    at = max(s.end for s in row)
        waves.extend(waveify(spans))
    return Schedule("tasks-split", tuple(waves))


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


def cpa_allocation(problem: Problem) -> dict[str, int]:
    """Phase 1 of CPA: grow allocations on the critical path until it meets the area."""
    alloc = {o.id: o.pareto[0] for o in problem.ops}
    N = problem.devices
    for _ in range(sum(len(o.pareto) for o in problem.ops)):
        time = {o.id: o.layers * o.t(alloc[o.id]) for o in problem.ops}
        finish: dict[str, float] = {}
        via: dict[str, str | None] = {}
        for o in problem.ops:
            dep = max(o.deps, key=lambda d: finish[d], default=None)
            finish[o.id] = time[o.id] + (finish[dep] if dep else 0.0)
            via[o.id] = dep
        area = sum(time[i] * alloc[i] for i in time) / N
        end = max(finish, key=lambda i: finish[i])
        if finish[end] <= area:
            break
        path = []
        node: str | None = end
        while node is not None:
            path.append(node)
            node = via[node]
        best, best_score = None, -1.0
        for i in path:
            op = problem.op(i)
            nxt = op.next_faster(alloc[i], N)
            if nxt is None:
                continue
            saved = time[i] - op.layers * op.t(nxt)
            extra = op.layers * op.t(nxt) * nxt - time[i] * alloc[i]
            score = float("inf") if extra <= 0 else saved / extra
            if score > best_score:
                best, best_score = (i, nxt), score
        if best is None:
            break
        alloc[best[0]] = best[1]
    return alloc


def list_schedule(problem: Problem, alloc: dict[str, int]) -> list[Span]:
    """Phase 2 of CPA: event-driven list scheduling by bottom level."""
    time = {o.id: o.layers * o.t(alloc[o.id]) for o in problem.ops}
    consumers: dict[str, list[str]] = {o.id: [] for o in problem.ops}
    for o in problem.ops:
        for d in o.deps:
            consumers[d].append(o.id)
    bottom: dict[str, float] = {}
    for o in reversed(problem.ops):
        bottom[o.id] = time[o.id] + max((bottom[c] for c in consumers[o.id]), default=0.0)
    waiting = {o.id: len(o.deps) for o in problem.ops}
    ready = [o.id for o in problem.ops if not o.deps]
    running: list[tuple[Fraction, int, str]] = []  # (end, tiebreak, op)
    spans: list[Span] = []
    free, now, seq = problem.devices, Fraction(0), 0
    while ready or running:
        ready.sort(key=lambda i: -bottom[i])
        for i in list(ready):
            if alloc[i] <= free:
                ready.remove(i)
                free -= alloc[i]
                spans.append(Span.after(problem.op(i), alloc[i], now))
                heapq.heappush(running, (spans[-1].end, seq, i))
                seq += 1
        if not running:
            raise AssertionError("list scheduling stalled: an allocation exceeds the devices")
        now, _, i = heapq.heappop(running)
        free += alloc[i]
        done = [i]
        while running and running[0][0] <= now:
            done.append(heapq.heappop(running)[2])
            free += alloc[done[-1]]
        for j in done:
            for c in consumers[j]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    ready.append(c)
    return spans


def cpa_schedule(problem: Problem) -> Schedule:
    spans = list_schedule(problem, cpa_allocation(problem))
    return Schedule("cpa", waveify(spans))
