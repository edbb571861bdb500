"""From a MetaGraph and a cost model to the planner's inputs, and from schedules to a Plan.

``PlanContext`` gathers everything the schedulers, placement and timing read, computed once
per planning call: the ``Problem`` (curves reduced to the allocations that fit in memory),
the data flows between MetaOps, and the topology. ``evaluate`` places and times one
schedule; ``to_plan`` writes the chosen one in the plan format.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from spindle_dsl.cost.base import CostModel, Curves
from spindle_dsl.errors import PlanError
from spindle_dsl.metagraph import MetaGraph, MetaOp
from spindle_dsl.plan.model import (
    ClusterRef,
    Entry,
    Plan,
    PlanMetaOp,
    SolverInfo,
    SpecRef,
    Wave,
)
from spindle_dsl.planner.allocator import level_optimum
from spindle_dsl.planner.placement import Placement, Topology, place
from spindle_dsl.planner.problem import OpSpec, Problem, Schedule
from spindle_dsl.planner.timing import Flows, SharedModule, Timing, time_placement

GiB = 2**30


@dataclass(frozen=True)
class PlanContext:
    graph: MetaGraph
    cost: CostModel
    curves: Curves
    problem: Problem
    flows: Flows
    topology: Topology


@dataclass(frozen=True)
class Evaluated:
    schedule: Schedule
    placement: Placement
    timing: Timing

    @property
    def iteration_s(self) -> float:
        return self.timing.iteration_s

    @property
    def fits(self) -> bool:
        return not self.placement.overflow

    def key(self, capacity: int) -> tuple[float, float]:
        """What planning minimises: bytes over capacity (summed over devices), then time."""
        over = sum(max(0, m - capacity) for m in self.placement.memory)
        return (float(over), self.iteration_s)


def _gib(x: float) -> str:
    return f"{x / GiB:.1f} GiB"


def _op_spec(op: MetaOp, graph: MetaGraph, cost: CostModel, curves: Curves) -> OpSpec:
    """The op's curve, restricted to allocations on which one of its layers fits."""
    cap = graph.cluster.device.memory_bytes
    N = graph.cluster.devices
    pts = [(n, s) for n, s in curves[op.id].items() if n <= N]
    fit = [(n, s) for n, s in pts if cost.memory_bytes(op, n, 1) <= cap]
    if not fit:
        top = max(n for n, _ in pts) if pts else N
        need = cost.memory_bytes(op, top, 1)
        raise PlanError(
            f"MetaOp '{op.id}' does not fit: one of its layers needs {_gib(need)} per device "
            f"even on {top} devices, and a {graph.cluster.device.name} has {_gib(cap)}; "
            "use more devices or a larger device, a smaller global batch, or freeze the module"
        )
    return OpSpec(
        op.id,
        op.layers,
        op.deps,
        tuple(n for n, _ in fit),
        tuple(s for _, s in fit),
        task=op.task,
    )


def flows_of(graph: MetaGraph) -> Flows:
    """Activation sizes on every edge and the layers each shared module has in each op."""
    dt = graph.dtype_bytes
    carry = {m.id: float(m.batch * m.out_tokens * m.out_width * dt) for m in graph.metaops}
    edges = []
    for m in graph.metaops:
        for i in m.inputs:
            if not i.from_modality:
                src = graph.op(i.source)
                edges.append((src.id, m.id, float(m.batch * i.tokens * src.out_width * dt)))
    shared = []
    for group in graph.sharing_groups:
        module = graph.module(group.module)
        if module.frozen:
            continue
        holders = []
        for op_id in group.metaops:
            offset = 0
            for name, layers in graph.op(op_id).segments:
                if name == group.module:
                    holders.append((op_id, offset))
                    break
                offset += layers
        shared.append(
            SharedModule(
                module.name, module.layers, group.param_bytes / module.layers, tuple(holders)
            )
        )
    backward = {m.id: m.needs_backward for m in graph.metaops}
    return Flows(carry, backward, tuple(edges), tuple(shared))


def context(graph: MetaGraph, cost: CostModel) -> PlanContext:
    if not graph.metaops:
        raise PlanError("the spec has no MetaOps to plan (no task runs any module)")
    curves = cost.curves(graph)
    flows = flows_of(graph)
    ops = tuple(_op_spec(m, graph, cost, curves) for m in graph.metaops)
    problem = Problem(ops, graph.cluster.devices)
    n_star: dict[str, float] = {}
    for level in problem.levels:
        n_star.update(level_optimum([problem.op(i) for i in level], problem.devices).n_star)
    ops = tuple(replace(o, switch_s=_switch_s(graph, cost, flows, o, n_star[o.id])) for o in ops)
    problem = Problem(ops, graph.cluster.devices)
    partners: dict[str, tuple[str, ...]] = {}
    for g in graph.sharing_groups:
        for op_id in g.metaops:
            partners[op_id] = tuple(
                dict.fromkeys([*partners.get(op_id, ()), *(o for o in g.metaops if o != op_id)])
            )
    c = graph.cluster
    weight = dict(flows.carry_bytes)
    for _src, dst, nbytes in flows.edges:  # a MetaOp's first piece pulls its inputs
        weight[dst] = max(weight[dst], nbytes)
    topo = Topology(c.devices, c.devices_per_node, c.device.memory_bytes, partners, weight)
    return PlanContext(graph, cost, curves, problem, flows, topo)


def _switch_s(graph: MetaGraph, cost: CostModel, flows: Flows, op: OpSpec, n_star: float) -> float:
    """What changing an op's allocation mid-way roughly costs: re-sharding its activations
    from a group of its continuous-optimum size to one a device larger (forward, and
    backward if it trains)."""
    N = graph.cluster.devices
    if N == 1:
        return 0.0
    n = max(1, min(N - 1, round(n_star)))
    t = cost.transfer_seconds(flows.carry_bytes[op.id], range(n), range(n + 1), graph.cluster)
    return t * (2 if flows.backward[op.id] else 1)


def evaluate(ctx: PlanContext, sched: Schedule) -> Evaluated:
    """Place ``sched`` on devices and predict its iteration time."""
    graph, cost, cluster = ctx.graph, ctx.cost, ctx.graph.cluster
    memo: dict[tuple[str, int, int], int] = {}

    def memory(op_id: str, n: int, layers: int) -> int:
        key = (op_id, n, layers)
        if key not in memo:
            memo[key] = cost.memory_bytes(graph.op(op_id), n, layers)
        return memo[key]

    placement = place(ctx.problem, sched, ctx.topology, memory)
    timing = time_placement(
        placement,
        lambda op, n: ctx.problem.op(op).t(n),
        ctx.flows,
        lambda b, s, d: cost.transfer_seconds(b, s, d, cluster),
        lambda b, ds: cost.allreduce_seconds(b, ds, cluster),
    )
    return Evaluated(sched, placement, timing)


def frugal_bytes(ctx: PlanContext, op_id: str) -> int:
    """Least device-bytes one MetaOp can occupy: min over n of n * memory(all its layers)."""
    op = ctx.graph.op(op_id)
    return min(n * ctx.cost.memory_bytes(op, n, op.layers) for n in ctx.problem.op(op_id).ns)


def overflow_message(ctx: PlanContext, ev: Evaluated) -> str:
    """Say what does not fit, by how much, and what to change.

    When the MetaOps cannot fit even in the cluster's total memory, say so with the biggest
    ones; otherwise name the fullest device and the MetaOps that fill it.
    """
    cap = ctx.topology.capacity
    name = ctx.graph.cluster.device.name
    N = ctx.topology.devices
    advice = (
        "use more devices (--devices) or larger ones (--device), a smaller global batch, "
        "or freeze some modules"
    )
    frugal = {o.id: frugal_bytes(ctx, o.id) for o in ctx.problem.ops}
    total = sum(frugal.values())
    if total > N * cap:
        top = sorted(frugal.items(), key=lambda kv: -kv[1])[:3]
        biggest = ", ".join(f"'{k}' {_gib(v)}" for k, v in top)
        return (
            f"the MetaOps do not fit: they need at least {_gib(total)} of device memory in all "
            f"(each on its "
            f"most memory-frugal allocation; largest: {biggest}), but {N} x {name} hold "
            f"{_gib(N * cap)}; {advice} (at least {-(-total // cap)} devices of this kind)"
        )
    d = max(range(N), key=lambda i: ev.placement.memory[i])
    parts: dict[str, int] = {}
    for wave in ev.placement.waves:
        for p in wave:
            if d in p.devices:
                need = ctx.cost.memory_bytes(ctx.graph.op(p.op), p.n, p.layers)
                parts[p.op] = parts.get(p.op, 0) + need
    top = sorted(parts.items(), key=lambda kv: -kv[1])
    listed = ", ".join(f"'{k}' {_gib(v)}" for k, v in top[:3])
    return (
        f"MetaOp '{top[0][0]}' does not fit: device {d} would hold "
        f"{_gib(ev.placement.memory[d])} ({listed}), but a {name} has {_gib(cap)}; {advice}"
    )


def to_plan(
    ctx: PlanContext,
    chosen: Evaluated,
    *,
    lower_bound_s: float,
    baselines: dict[str, float],
    wall_s: float,
    notes: tuple[str, ...],
    extra: dict,
) -> Plan:
    """The plan file: the format's required fields plus ``breakdown`` (compute_s,
    transfer_s, grad_sync_s), ``memory_bytes`` (predicted peak per device), ``notes``, and
    the ``extra`` fields ``make_plan`` adds: ``scheduler`` (asked for), ``candidates_s``
    (iteration time of every schedule considered), ``level_reference_s`` (sum over
    MetaLevels of the continuous optimum) and ``solver_notes``."""
    graph = ctx.graph
    metaops = tuple(
        PlanMetaOp(
            id=m.id,
            task=m.task,
            module=m.module,
            kind=m.kind,
            layers=m.layers,
            batch=m.batch,
            tokens=m.tokens,
            deps=m.deps,
            forward_flops_per_layer=m.forward_flops_per_layer,
            param_bytes_per_layer=m.param_bytes_per_layer,
            seconds_per_layer=tuple(
                zip(ctx.problem.op(m.id).ns, ctx.problem.op(m.id).seconds, strict=True)
            ),
        )
        for m in graph.metaops
    )
    waves = []
    start = 0.0
    for wi, (wave, dur) in enumerate(
        zip(chosen.placement.waves, chosen.timing.durations, strict=True)
    ):
        entries = tuple(
            Entry(p.op, p.first, p.end, p.devices, p.layers * ctx.problem.op(p.op).t(p.n))
            for p in wave
        )
        waves.append(Wave(wi, start, dur, entries))
        start += dur
    t = chosen.timing
    sched = chosen.schedule
    c = graph.cluster
    return Plan(
        spec=SpecRef(graph.spec_path, graph.spec_sha256, graph.mix),
        cluster=ClusterRef(c.devices, c.device.name, c.devices_per_node, c.device.memory_bytes),
        metaops=metaops,
        waves=tuple(waves),
        iteration_s=t.iteration_s,
        lower_bound_s=lower_bound_s,
        baselines=tuple((f"{k}_s", v) for k, v in baselines.items()),
        solver=SolverInfo(sched.name, sched.status, wall_s, sched.gap),
        breakdown=(
            ("compute_s", t.compute_s),
            ("transfer_s", t.transfer_s),
            ("grad_sync_s", t.grad_sync_s),
        ),
        memory_bytes=chosen.placement.memory,
        notes=notes,
        extra=extra,
    )
