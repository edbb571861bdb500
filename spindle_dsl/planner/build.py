"""From a MetaGraph and a cost model to the planner's inputs, and from schedules to a Plan.

``PlanContext`` gathers everything the schedulers, placement and timing read, computed once
per planning call and set of recomputing MetaOps: the ``Problem`` (curves reduced to the
allocations on which a layer fits in memory), the data flows between MetaOps, and the
topology. ``evaluate`` places and times one schedule; ``to_plan`` writes the chosen one in the
plan format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from spindle_dsl.cost.base import CostModel, Curves, SliceMemory, has_slice_memory
from spindle_dsl.cost.step import StepModel
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
from spindle_dsl.planner.ledger import Ledger, PartLedger, PieceLedger
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
    recompute: frozenset[str] = frozenset()  # MetaOps that recompute activations in backward
    memo: dict = field(default_factory=dict, compare=False, repr=False)  # slice memory cache
    evaluated: dict = field(default_factory=dict, compare=False, repr=False)  # waves -> Evaluated
    step: StepModel | None = None  # the runtime's whole step (cost.step), when the model has one

    @property
    def per_part(self) -> bool:
        """Whether memory is priced per parameter part (``SliceMemoryModel``)."""
        return has_slice_memory(self.cost)

    def slice_memory(self, op_id: str, n: int, first: int, end: int) -> SliceMemory:
        """Bytes per device of layers ``[first, end)`` of an op on ``n`` devices (cached)."""
        key = (op_id, n, first, end)
        if key not in self.memo:
            op = self.graph.op(op_id)
            rc = op_id in self.recompute
            self.memo[key] = self.cost.slice_memory(self.graph, op, n, first, end, rc)  # type: ignore[attr-defined]
        return self.memo[key]

    def ledger(self) -> Ledger:
        """An empty ledger for one placement."""
        if self.per_part:
            return PartLedger(self.topology.devices, self.slice_memory)
        graph, cost = self.graph, self.cost
        return PieceLedger(
            self.topology.devices, lambda op, n, layers: cost.memory_bytes(graph.op(op), n, layers)
        )


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
    """Bytes in GiB, with three significant digits below 10 GiB (small test clusters)."""
    v = x / GiB
    return f"{v:.1f} GiB" if v >= 10 else f"{v:.3g} GiB"


def _one_layer_bytes(
    op: MetaOp, graph: MetaGraph, cost: CostModel, recompute: frozenset[str], ns: Sequence[int]
) -> list[int]:
    """For each n of ``ns`` (the allocations the op's curve lists, never every n up to the
    cluster size), the most one device needs for a single layer of ``op`` on ``n`` devices:
    its first layer (with the input stages) or its last (with an LM head and the loss)."""
    if not has_slice_memory(cost):
        return [cost.memory_bytes(op, n, 1) for n in ns]
    rc = op.id in recompute
    ends = ((0, 1), (op.layers - 1, op.layers))
    table = getattr(cost, "alone_bytes", None)
    if table is not None:
        first, last = (table(graph, op, a, b, rc, ns=ns) for a, b in ends)
    else:
        first, last = (
            [cost.slice_memory(graph, op, n, a, b, rc).alone(n) for n in ns]  # type: ignore[attr-defined]
            for a, b in ends
        )
    return [max(x, y) for x, y in zip(first, last, strict=True)]


def _op_spec(
    op: MetaOp, graph: MetaGraph, cost: CostModel, curves: Curves, recompute: frozenset[str]
) -> OpSpec:
    """The op's curve, restricted to allocations on which one of its layers fits."""
    cap = graph.cluster.device.memory_bytes
    N = graph.cluster.devices
    pts = [(n, s) for n, s in curves[op.id].items() if n <= N]
    one = _one_layer_bytes(op, graph, cost, recompute, [n for n, _ in pts])
    fit = [(n, s) for (n, s), need in zip(pts, one, strict=True) if need <= cap]
    if not fit:
        top = max(range(len(pts)), key=lambda i: pts[i][0])
        need = one[top]
        raise PlanError(
            f"MetaOp '{op.id}' does not fit: one of its layers needs {_gib(need)} per device "
            f"even on {pts[top][0]} devices, and a {graph.cluster.device.name} has {_gib(cap)}; "
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


def context(
    graph: MetaGraph, cost: CostModel, recompute: frozenset[str] = frozenset()
) -> PlanContext:
    """Everything planning reads, with ``recompute`` MetaOps priced as recomputing (only
    for a cost model with ``slice_memory``; others never recompute)."""
    if not graph.metaops:
        raise PlanError("the spec has no MetaOps to plan (no task runs any module)")
    if has_slice_memory(cost):
        curves = cost.curves(graph, recompute=recompute)  # type: ignore[call-arg]
    else:
        recompute = frozenset()
        curves = cost.curves(graph)
    flows = flows_of(graph)
    ops = tuple(_op_spec(m, graph, cost, curves, recompute) for m in graph.metaops)
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
    return PlanContext(
        graph, cost, curves, problem, flows, topo, recompute, step=step_of(cost, graph)
    )


def step_of(cost: CostModel, graph: MetaGraph) -> StepModel | None:
    """The cost model's step model of ``graph`` (None for a model without one)."""
    make = getattr(cost, "step_model", None)
    return make(graph) if callable(make) else None


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
    cost, cluster = ctx.cost, ctx.graph.cluster
    placement = place(ctx.problem, sched, ctx.topology, ctx.ledger())
    timing = time_placement(
        placement,
        lambda op, n: ctx.problem.op(op).t(n),
        ctx.flows,
        lambda b, s, d: cost.transfer_seconds(b, s, d, cluster),
        lambda b, ds: cost.allreduce_seconds(b, ds, cluster),
        ctx.step,
        micro_batches=getattr(ctx, "micro_batches", 1),
        zero_stage=getattr(ctx, "zero_stage", 1),
    )
    return Evaluated(sched, placement, timing)


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
    transfer_s, grad_sync_s, and with a step model wave_overhead_s, loss_s and optimizer_s:
    they add up to ``iteration_s``), ``memory_bytes`` (predicted peak per device), ``notes``,
    and the ``extra`` fields ``make_plan`` adds: ``scheduler`` (asked for), ``candidates_s``
    (iteration time of every schedule considered), ``level_reference_s`` (sum over
    MetaLevels of the continuous optimum) and ``solver_notes``; with a step model also
    ``step_model`` (``step_model_record``)."""
    graph = ctx.graph
    metaops = tuple(
        PlanMetaOp.of(
            m,
            tuple(zip(ctx.problem.op(m.id).ns, ctx.problem.op(m.id).seconds, strict=True)),
            recompute=m.id in ctx.recompute,
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
        cluster=ClusterRef.of(c),
        metaops=metaops,
        waves=tuple(waves),
        iteration_s=t.iteration_s,
        lower_bound_s=lower_bound_s,
        baselines=tuple((f"{k}_s", v) for k, v in baselines.items()),
        solver=SolverInfo(sched.name, sched.status, wall_s, sched.gap),
        breakdown=t.breakdown(),
        memory_bytes=chosen.placement.memory,
        notes=notes,
        extra={**extra, **step_model_record(ctx.step, t)},
    )


def step_model_record(step: StepModel | None, t: Timing) -> dict:
    """The plan's ``step_model`` field: how its step was priced (the overheads' source, the
    cores shared, whether the gradient reduction overlaps the backward and whether the curves
    carry it) and, per wave, the overhead on top of its layers, in total and per entry, so
    that ``spindle compare`` can set each wave and MetaOp against the measured run, and its
    transfers (all per micro-batch pass)."""
    if step is None:
        return {}
    return {
        "step_model": {
            "source": step.overheads.source,
            "cores": step.cores,
            "reduction_overlap": step.overheads.reduction_overlap,
            "grad_in_curves": step.grad_in_curves,
            "wave_extra_s": list(t.wave_extra),
            "entry_extra_s": [list(e) for e in t.entry_extra],
            "wave_transfer_s": list(t.wave_transfer),
        }
    }
