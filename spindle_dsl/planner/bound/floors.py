"""The bounds that need no solver: the area and critical-path bound on any plan's compute
(``lower_bound_s``), and floors under the step terms the LP bound does not count: the loss
phase, the optimizer and the step's closing all-reduce (``step_floor``).

Why. The LP bound (``lp_bound``) bounds the waves' compute. A step priced by a step model
(``cost.step``) adds, as plain terms of ``iteration_s`` that nothing overlaps, the loss phase
(k passes), the optimizer (once) and the closing all-reduce of the losses (once), besides
wave overheads, transfers and the gradient reduction (which a plan can make small, so they get
no floor here). On a job whose LM heads are heavy the loss phase alone can be a tenth of the
iteration, and a bound that ignores it then calls an optimal plan 10% off. Each floor below holds
for every placement of every plan of that step model at k passes, whatever its waves and
ZeRO stage, so ``k * (LP(k) + loss_floor(k)) + optimizer_floor + closing`` is still below
every plan made with k micro-batches (``search.make._lower_bound`` takes the least over the k).

Loss phase, one pass (``StepModel._loss``): a sink's loss runs on the devices of its last
entry, n of them, each on a shard ``ceil(ceil(B / k) / n)`` (a contrastive loss: half its
price on the shard on each, plus half the whole micro-batch's price on the first). A device
carrying sink s therefore pays at least ``min_n own_s(n)``, and all of s's devices together
at least ``min_n area_s(n)``; the phase lasts as long as its busiest device (core sharing only
lengthens it: a shared makespan is at least the longest job), which is at least the largest
single floor and at least the summed areas over N devices. The minimum is taken over every
n from 1 to N (the shard values those reach), so no monotonicity of a measured line is
assumed.

Optimizer (``StepModel._optimizer``): every trainable part (non-zero gradient bytes) is held
by at least one device; a holder pays ``alpha + beta * owned`` (AdamW on the bytes it owns,
``owned > 0`` on every holder) plus the per-part work of every part it holds, at least the
least of its two forms (one of several holders, or the only one: ``part_least_seconds``),
which is what ``part_seconds`` below stands for. Under ZeRO 1
or 2 the parts' bytes are sharded over their holders, so owned bytes sum to the total T over
the D <= N holding devices (under ZeRO 0 they sum to more); per-part work sums to at least
P, the sum over parts. The busiest holder pays at least the average, ``alpha + (beta T + P)
/ D >= alpha + (beta T + P) / N``, and at least what one part alone brings,
``alpha + beta b_p / N + part_seconds(p)``. This needs ``beta >= 0`` and every per-part
work >= 0 (a fitted line could break that: then the optimizer gets no floor).

The optimizer's per-part work again, weighed by the LP. A layer is run by exactly one piece
of each MetaOp using it, on that piece's n devices, so a layer part is held by at least the
largest (hence at least the average) of those n over the ops sharing it: summed over the
devices, the per-part work is at least ``sum_m w_m sum_layers n`` with ``w_m`` the least over
m's layers of part_seconds / (ops sharing the part), which is ``sum_m w_m L_m sum_n x[m,n] n``
in the LP's terms, plus the per-part work of the other parts on one holder each. The busiest
device pays at least ``alpha`` plus the average over N of all that and the AdamW bytes, so
``lp_bound(holder_work=w)`` plus the rest bounds k x compute plus the optimizer, and the LP
may find that narrower allocations (fewer holders) pay.

Groups (``holder_groups``). The average above gives each of j ops sharing a part 1/j of its
work, as if all j ran it on the same devices; where they run side by side on disjoint groups,
which is what concurrency is, the part's holders are their sum, and the widest op alone
already counts more than the average. Where two or more ops run the same parts, one per layer,
and no other op runs any of them (each task's pass through a shared language model), the
holders summed over those parts are at least ``sum_p max_m n_m(p) >= max_m sum_p n_m(p)``, so
the work is at least ``w max_m L sum_n x[m,n] n`` with w the least per-part work of the parts,
undivided: the LP takes it as a variable above each member's ``L sum_n x[m,n] n``
(``lp_bound(holder_groups=...)``), never below the average, and the groups' ops leave
``holder_work``. On the specs of ``bench/plan_quality.py``'s gap table, each task's copy of
the shared text tower, encoder or decoder is such a group.

Holders (``_holder_lines``). A part's per-part work is not one price per holder: its only
holder steps it in place (``part_alone_seconds``), but each of h >= 2 holders also copies it
through a flat buffer (``part_shared_least_seconds``, the least over the ZeRO stages: s), so
over its holders it costs ``alone`` at h = 1 and at least ``s h`` at h >= 2, and
``s h - max(0, s - alone)`` is below both. The weights above take s per holder, and the rest
gives back ``max(0, s - alone)`` per layer part; every part is held at least once, so this is
never looser than ``min(s, alone)`` per holder, and where a part is held by many devices (a
shared tower run wide) it counts the copies each of them makes.

Shared cores. Where a node's devices outnumber its cores (CPU workers), the step model runs a
node's per-device work at most ``cores`` at a time (``cost.step.shared_makespan``): a node's
loss phase or optimizer lasts at least its devices' summed work over its cores, and at least
its busiest device's own work, so each average above holds over the cluster's cores
(``StepModel.lanes``) instead of its N devices (the busiest node pays at least the summed
work over all the lanes; a node with fewer holders than cores pays at least its busiest
holder's, which is at least its holders' average). What one device or one part brings alone
is unchanged.

Closing all-reduce: a fixed price per step (``StepPrice.closing_s``), read from the step
model by pricing no waves.

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

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from spindle_dsl.cost.comm import ceil_div
from spindle_dsl.cost.step import StepModel
from spindle_dsl.cost.step_parts import SinkLoss
from spindle_dsl.planner.model.problem import Problem, level_optimum


@dataclass(frozen=True)
class StepFloor:
    """Seconds no plan at k passes can go below, per term (see the module docstring):
    ``loss_s`` one pass's loss phase, ``optimizer_s`` and ``closing_s`` once per step.
    ``holder_work`` (per op: seconds per layer on each device holding it) and ``rest_s`` split
    the optimizer another way, for the LP to weigh (``lp_bound(holder_work=...)``): the LP's
    value plus ``rest_s`` bounds k x compute plus the optimizer."""

    loss_s: float
    optimizer_s: float
    closing_s: float
    holder_work: Mapping[str, float] = field(default_factory=dict)
    rest_s: float = 0.0
    # ops that share every layer part with each other and with no other op, and the least
    # per-part work of those parts: their holder work is the widest op's (``holder_groups``)
    holder_groups: tuple[tuple[tuple[str, ...], float], ...] = ()

    def total_s(self, micro_batches: int) -> float:
        """What the floors add to an iteration of ``micro_batches`` passes."""
        return max(1, micro_batches) * self.loss_s + self.optimizer_s + self.closing_s

    def beside_lp_s(self, micro_batches: int) -> float:
        """What they add beside an LP that weighed ``holder_work``."""
        return max(1, micro_batches) * self.loss_s + self.rest_s + self.closing_s


NO_FLOOR = StepFloor(0.0, 0.0, 0.0)


def _shards(batch: int, k: int, devices: int) -> list[tuple[int, int]]:
    """(n, shard) for the least n reaching each distinct shard of one pass's micro-batch."""
    micro = ceil_div(batch, k)
    out: dict[int, int] = {}
    for n in range(1, min(devices, micro) + 1):
        out.setdefault(ceil_div(micro, n), n)
    return sorted((n, s) for s, n in out.items())


def _sink_floor(step: StepModel, sink: SinkLoss, k: int) -> tuple[float, float]:
    """(least seconds on one device carrying ``sink``, least device-seconds of it), one pass."""
    batch = step.ops[sink.sink].batch
    if batch <= 0:
        return 0.0, 0.0
    shards = _shards(batch, k, step.devices)
    if sink.loss == "contrastive":
        whole = step.loss_seconds(sink, ceil_div(batch, k)) / 2
        own = min(step.loss_seconds(sink, s) / 2 for _, s in shards) + whole
        area = min(n * step.loss_seconds(sink, s) / 2 for n, s in shards) + whole
        return max(own, 0.0), max(area, 0.0)
    own = min(step.loss_seconds(sink, s) for _, s in shards)
    area = min(n * step.loss_seconds(sink, s) for n, s in shards)
    return max(own, 0.0), max(area, 0.0)


def loss_floor_s(step: StepModel, micro_batches: int) -> float:
    """One pass's loss phase can be no shorter than this (module docstring)."""
    floors = [_sink_floor(step, s, max(1, micro_batches)) for s in step.sinks]
    if not floors:
        return 0.0
    return max(max(own for own, _ in floors), sum(area for _, area in floors) / step.lanes)


def _parts(step: StepModel) -> dict[str, float]:
    """Every trainable part the step reduces and updates, with its gradient bytes."""
    parts: dict[str, float] = {}

    def add(key: str | None, nbytes: float) -> None:
        if key is not None and nbytes > 0:
            parts[key] = min(nbytes, parts.get(key, nbytes))

    for op in step.ops.values():
        for key, nbytes in op.layer_parts:
            add(key, nbytes)
        for stage in op.inputs:
            add(stage.part, stage.grad_bytes)
    for sink in step.sinks:
        add(sink.head_part, sink.head_bytes)
    return parts


def _part_work(step: StepModel) -> tuple[dict[str, float], dict[str, float]] | None:
    """Every trainable part's gradient bytes and the least per-part work a holder of it
    pays; None where there is none, or where a negative slope or per-part price voids the
    arguments that use them (module docstring)."""
    o = step.overheads
    parts = _parts(step)
    if not parts:
        return None
    work = {key: o.part_least_seconds(key, nbytes) for key, nbytes in parts.items()}
    if o.optimizer.beta_s < 0 or min(work.values()) < 0:
        return None
    return parts, work


def optimizer_floor_s(step: StepModel) -> float:
    """The optimizer can take no less than this on the busiest device (module docstring)."""
    o = step.overheads
    got = _part_work(step)
    if got is None:
        return 0.0
    parts, work = got
    N = step.devices
    alpha, beta = o.optimizer.alpha_s, o.optimizer.beta_s
    average = alpha + (beta * sum(parts.values()) + sum(work.values())) / step.lanes
    single = max(alpha + beta * parts[key] / N + work[key] for key in parts)
    return max(average, single, 0.0)


def holder_groups(step: StepModel) -> tuple[tuple[tuple[str, ...], float], ...]:
    """The groups of ops the LP may weigh by their widest member (module docstring,
    "Groups"): two or more ops whose layers are the same parts, one each, held by no other
    op, each group with the least per-holder work of its parts (``_holder_lines``, not
    divided among them). Empty where a negative slope or per-part price voids the argument."""
    return _holder_terms(step)[2]


def _holder_terms(
    step: StepModel,
) -> tuple[dict[str, float], float, tuple[tuple[tuple[str, ...], float], ...]]:
    """The optimizer split for the LP (module docstring, last paragraph) and
    ``holder_groups``, from one pass over the parts and their users: per op the least over its
    layers of the layer part's per-holder work (``_holder_lines``) over the number of ops
    sharing that part; the rest, ``alpha + (beta T + P' - over) / N`` with P' the per-part work
    of the parts that are not layers (input stages, LM heads), each on at least one holder, and
    ``over`` what the holder lines give back. Nothing (an empty map and 0) where a negative
    slope or per-part price voids the argument."""
    o = step.overheads
    got = _part_work(step)
    if got is None:
        return {}, 0.0, ()
    parts, work = got
    users: dict[str, set[str]] = {}  # per layer part, the ops that run it
    for op_id, op in step.ops.items():
        for key, nbytes in op.layer_parts:
            if nbytes > 0:
                users.setdefault(key, set()).add(op_id)
    slope, over = _holder_lines(step, parts, users)
    per_op = {}
    by_parts: dict[frozenset[str], list[str]] = {}
    for op_id, op in step.ops.items():
        if op.layer_parts and all(key in work for key, _ in op.layer_parts):
            per_op[op_id] = min(slope[key] / len(users[key]) for key, _ in op.layer_parts)
            keys = [key for key, _ in op.layer_parts]
            if len(set(keys)) == len(keys):  # a part twice in one op: one holder set for both
                by_parts.setdefault(frozenset(keys), []).append(op_id)
    others = sum(w for key, w in work.items() if key not in users)
    bytes_s = o.optimizer.beta_s * sum(parts.values())
    rest = o.optimizer.alpha_s + (bytes_s + others - over) / step.lanes
    groups = tuple(
        sorted(
            (tuple(sorted(ops)), min(slope[key] for key in keys))
            for keys, ops in by_parts.items()
            if len(ops) > 1 and all(users[key] == set(ops) for key in keys)
        )
    )
    return per_op, rest, groups


def _holder_lines(
    step: StepModel, parts: Mapping[str, float], layer_keys: Collection[str]
) -> tuple[dict[str, float], float]:
    """Per layer part, the slope of a line below its per-part work summed over h holders,
    for every h >= 1, and what those lines give up at h = 1, summed (module docstring,
    "Holders"): one holder pays the part's work alone, each of h >= 2 pays at least the least
    shared form, s; ``s h - max(0, s - alone)`` is below both."""
    o = step.overheads
    slope, over = {}, 0.0
    for key in layer_keys:
        nbytes = parts[key]
        alone = o.part_alone_seconds(key, nbytes)
        slope[key] = o.part_shared_least_seconds(key, nbytes)
        over += max(0.0, slope[key] - alone)
    return slope, over


def step_floor(step: StepModel | None, micro_batches: int) -> StepFloor:
    """The floors for plans of ``micro_batches`` passes priced by ``step`` (none without a
    step model: then the iteration is compute, transfers and sync, and the LP is the bound)."""
    if step is None:
        return NO_FLOOR
    closing = step.price((), micro_batches=micro_batches).closing_s
    per_op, rest, groups = _holder_terms(step)
    grouped = {op for ops, _ in groups for op in ops}
    per_op = {op: w for op, w in per_op.items() if op not in grouped}
    return StepFloor(
        loss_floor_s(step, micro_batches), optimizer_floor_s(step), closing, per_op, rest, groups
    )


__all__ = [
    "NO_FLOOR",
    "StepFloor",
    "holder_groups",
    "loss_floor_s",
    "optimizer_floor_s",
    "step_floor",
]


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
