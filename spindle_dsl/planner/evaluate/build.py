"""From a MetaGraph and a cost model to the planner's inputs, and from schedules to a Plan.

``PlanContext`` gathers everything the schedulers, placement and timing read, computed once
per planning call and setting of the memory levers (``levers.Levers``: micro-batches, ZeRO
stage, recomputing MetaOps): the ``Problem`` (one pass's curves reduced to the allocations on
which the MetaOp fits in memory), the data flows of one pass, and the topology. ``evaluate``
places and times one schedule (k passes); ``to_plan`` writes the chosen one in the plan format.

Memory constrains the allocation itself (``_op_spec``): an allocation is offered to the
schedulers only if one layer of the MetaOp fits on it, and, when memory is enforced, only if
the whole MetaOp (every layer's parameters, optimizer share and kept activations) fits on it
alone, unless no allocation can hold the whole MetaOp (then it has to be split over waves on
different devices, and the per-layer test is all that is asked). So every scheduler, the
paper's allocator and the MILPs included, plans with each MetaOp's minimum device count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
from spindle_dsl.planner.evaluate.ledger import Ledger, PartLedger, PieceLedger
from spindle_dsl.planner.evaluate.placement import Placement, Topology, place
from spindle_dsl.planner.evaluate.timing import Flows, SharedModule, Timing, time_placement
from spindle_dsl.planner.model.levers import (
    NO_LEVERS,
    Levers,
    PricingCache,
    pass_curves,
    spec_of,
)
from spindle_dsl.planner.model.problem import OpSpec, Problem, Schedule, level_optimum

GiB = 2**30
# all-reduce groups up to this many devices are priced once per search (``allreduce_of``)
REDUCTIONS_KEPT = 512


@dataclass(frozen=True)
class PlanContext:
    graph: MetaGraph  # the spec's graph: whole batches (what the plan's MetaOps record)
    cost: CostModel
    curves: Curves  # one pass under ``levers``
    problem: Problem
    flows: Flows  # the data of one pass
    topology: Topology
    levers: Levers = NO_LEVERS
    micro: MetaGraph | None = None  # the micro-batch view (None: the graph itself, k = 1)
    # slice memory, shared by every context of one lever search (``PricingCache.slices``) and
    # keyed by what it reads of the levers, so a probe that changes one MetaOp's recompute
    # prices only that MetaOp's slices
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    evaluated: dict = field(default_factory=dict, compare=False, repr=False)  # waves -> Evaluated
    step: StepModel | None = None  # the runtime's whole step (cost.step), when the model has one
    # (bytes, source devices, destination devices) -> seconds: shared by every context of one
    # lever search (``PricingCache.moves``), since a move's price does not depend on levers
    moves: dict = field(default_factory=dict, compare=False, repr=False)
    # (bytes, devices) -> seconds of an all-reduce, shared alike (``PricingCache.reductions``)
    reductions: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def recompute(self) -> frozenset[str]:
        """MetaOps that recompute their activations in the backward pass."""
        return self.levers.recompute

    @property
    def pass_graph(self) -> MetaGraph:
        """The graph one pass runs: every MetaOp on its micro-batch."""
        return self.micro or self.graph

    @property
    def per_part(self) -> bool:
        """Whether memory is priced per parameter part (``SliceMemoryModel``)."""
        return has_slice_memory(self.cost)

    def slice_memory(self, op_id: str, n: int, first: int, end: int) -> SliceMemory:
        """Bytes per device of layers ``[first, end)`` of an op on ``n`` devices (cached)."""
        lv = self.levers
        key = (op_id, n, first, end, lv.micro_batches, lv.zero_stage, op_id in lv.recompute)
        got = self.memo.get(key)
        if got is None:
            g = self.pass_graph
            got = self.memo[key] = slice_memory_of(self.cost, g, g.op(op_id), n, first, end, lv)
        return got

    def ledger(self) -> Ledger:
        """An empty ledger for one placement."""
        if self.per_part:
            return PartLedger(self.topology.devices, self.slice_memory)
        graph, cost = self.pass_graph, self.cost
        return PieceLedger(
            self.topology.devices, lambda op, n, layers: cost.memory_bytes(graph.op(op), n, layers)
        )


def _lever_kwargs(levers: Levers) -> dict[str, int]:
    """The memory levers a ``SliceMemoryModel`` takes, only where they differ from the
    protocol's defaults (one pass, ZeRO-1), so a model that does not take them still plans."""
    kw = {}
    if levers.zero_stage != 1:
        kw["zero_stage"] = levers.zero_stage
    if levers.micro_batches != 1:
        kw["micro_batches"] = levers.micro_batches
    return kw


def slice_memory_of(
    cost: CostModel, graph: MetaGraph, op: MetaOp, n: int, first: int, end: int, levers: Levers
) -> SliceMemory:
    """``cost.slice_memory`` under ``levers`` (``graph``: the pass's micro-batch view)."""
    rc = op.id in levers.recompute
    return cost.slice_memory(graph, op, n, first, end, rc, **_lever_kwargs(levers))  # type: ignore[attr-defined]


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

    def with_gain_note(self, before: Evaluated, head: str) -> Evaluated:
        """This plan, its schedule's notes ending with what a pass did (``head``) and the
        iteration it brought ``before`` down from, as the plan's notes print them."""
        note = f"{head}, iteration {ms_change(before.iteration_s, self.iteration_s)}"
        return replace(self, schedule=replace(self.schedule, notes=(*self.schedule.notes, note)))


def ms_change(before_s: float, after_s: float) -> str:
    """``"12.3 -> 10.1 ms"``: a term before and after a pass, for its note."""
    return f"{before_s * 1e3:.1f} -> {after_s * 1e3:.1f} ms"


def gib(x: float) -> str:
    """Bytes in GiB, with three significant digits below 10 GiB (small test clusters)."""
    v = x / GiB
    return f"{v:.1f} GiB" if v >= 10 else f"{v:.3g} GiB"


def alone_bytes_of(
    op: MetaOp,
    graph: MetaGraph,
    cost: CostModel,
    levers: Levers,
    first: int,
    end: int,
    ns: Sequence[int],
) -> list[int]:
    """For each n of ``ns`` (the allocations the op's curve lists, never every n up to the
    cluster size), bytes per device of layers ``[first, end)`` of ``op`` alone on n devices
    under ``levers`` (``graph``: the pass's micro-batch view)."""
    if not has_slice_memory(cost):
        return [cost.memory_bytes(op, n, end - first) for n in ns]
    table = getattr(cost, "alone_bytes", None)
    rc = op.id in levers.recompute
    if table is not None:
        return list(table(graph, op, first, end, rc, ns=ns, **_lever_kwargs(levers)))
    return [slice_memory_of(cost, graph, op, n, first, end, levers).alone(n) for n in ns]


def _one_layer_bytes(
    op: MetaOp, graph: MetaGraph, cost: CostModel, levers: Levers, ns: Sequence[int]
) -> list[int]:
    """For each n of ``ns``, the most one device needs for a single layer of ``op`` on ``n``
    devices: its first layer (with the input stages) or its last (with an LM head and the
    loss)."""
    first = alone_bytes_of(op, graph, cost, levers, 0, 1, ns)
    last = alone_bytes_of(op, graph, cost, levers, op.layers - 1, op.layers, ns)
    return [max(x, y) for x, y in zip(first, last, strict=True)]


def _op_spec(
    op: MetaOp,
    graph: MetaGraph,
    cost: CostModel,
    curves: Curves,
    levers: Levers,
    enforce: bool,
) -> OpSpec:
    """The op's curve, restricted to allocations on which one of its layers fits and, when
    memory is ``enforce``d, on which the whole op fits alone where any does (see the module
    docstring). ``graph`` is the pass's micro-batch view."""
    cap = graph.cluster.device.memory_bytes
    N = graph.cluster.devices
    pts = [(n, s) for n, s in curves[op.id].items() if n <= N]
    ns = [n for n, _ in pts]
    one = _one_layer_bytes(op, graph, cost, levers, ns)
    fit = [(n, s) for (n, s), need in zip(pts, one, strict=True) if need <= cap]
    if not fit:
        top = max(range(len(pts)), key=lambda i: pts[i][0]) if pts else None
        need, devices = (one[top], pts[top][0]) if top is not None else (0, N)
        raise LayerTooBig(
            op.id,
            need,
            devices,
            f"MetaOp '{op.id}' does not fit: one of its layers needs {gib(need)} per device "
            f"even on {devices} devices ({levers.describe(len(graph.metaops))}), and a "
            f"{graph.cluster.device.name} has {gib(cap)}",
        )
    if enforce:
        whole = alone_bytes_of(op, graph, cost, levers, 0, op.layers, [n for n, _ in fit])
        fit = [pt for pt, need in zip(fit, whole, strict=True) if need <= cap] or fit
    return spec_of(op, fit)


def offered_spec(
    op: MetaOp,
    cost: CostModel,
    curves: Curves,
    levers: Levers,
    enforce: bool,
    cache: PricingCache,
) -> OpSpec:
    """The spec a context under ``levers`` offers the schedulers for ``op`` (a MetaOp of the
    micro-batch view at ``levers``' k, ``curves`` its pass curves): ``_op_spec``, once per
    (op, k, ZeRO stage, recomputing or not, enforce) in ``cache``, the only inputs it reads.
    Raises ``LayerTooBig`` where one layer fits nowhere."""
    key = (op.id, levers.micro_batches, levers.zero_stage, op.id in levers.recompute, enforce)
    spec = cache.specs.get(key)
    if spec is None:
        micro = cache.view(levers.micro_batches)
        spec = cache.specs[key] = _op_spec(op, micro, cost, curves, levers, enforce)
    return spec  # type: ignore[return-value]


class LayerTooBig(PlanError):
    """One layer of a MetaOp fits on no allocation under the levers asked for."""

    def __init__(self, op: str, need: int, devices: int, message: str):
        super().__init__(message)
        self.op, self.need, self.devices = op, need, devices


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
    graph: MetaGraph,
    cost: CostModel,
    levers: Levers = NO_LEVERS,
    enforce: bool = False,
    cache: PricingCache | None = None,
) -> PlanContext:
    """Everything planning reads, priced under ``levers`` (a cost model without
    ``slice_memory`` takes only micro-batches: it neither recomputes nor shards); with
    ``enforce``, allocations on which a MetaOp cannot fit are not offered (``_op_spec``).
    ``cache`` shares curves and allocations between the settings one search prices."""
    if not graph.metaops:
        raise PlanError("the spec has no MetaOps to plan (no task runs any module)")
    if not has_slice_memory(cost):
        levers = Levers(levers.micro_batches)
    cache = cache if cache is not None and cache.graph is graph else PricingCache(graph)
    micro = cache.view(levers.micro_batches)
    curves = pass_curves(graph, cost, levers, cache)
    flows = flows_of(micro)
    ops = [offered_spec(m, cost, curves, levers, enforce, cache) for m in micro.metaops]
    step = step_of(cost, graph, cache)
    # CPU workers on fewer cores: the schedulers weigh a wave's work over the cores
    lanes = step.lanes if step is not None and step.lanes < graph.cluster.devices else None
    problem = Problem(tuple(ops), graph.cluster.devices)
    n_star: dict[str, float] = {}
    for level in problem.levels:
        specs = [problem.op(i) for i in level]
        # a level's optimum once per its specs: a probe changing one MetaOp's recompute
        # changes one level's (the specs are the cache's own objects, alive as long as it)
        key = (tuple(map(id, specs)), problem.devices)
        got = cache.optima.get(key)
        if got is None:
            got = cache.optima[key] = level_optimum(specs, problem.devices).n_star
        n_star.update(got)
    problem = Problem(
        tuple(
            replace(o, switch_s=_switch_s(graph, cost, flows, o, n_star[o.id], cache)) for o in ops
        ),
        graph.cluster.devices,
        lanes,
    )
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
    topo = Topology(
        c.devices, c.devices_per_node, c.device.memory_bytes, partners, weight, cache.orders
    )
    view = micro if micro is not graph else None
    return PlanContext(
        graph,
        cost,
        curves,
        problem,
        flows,
        topo,
        levers,
        view,
        memo=cache.slices,
        step=step,
        moves=cache.moves,
        reductions=cache.reductions,
    )


def step_of(
    cost: CostModel, graph: MetaGraph, cache: PricingCache | None = None
) -> StepModel | None:
    """The cost model's step model of ``graph`` (the whole batches: it is told k when it
    prices a step), None for a model without one; one per graph in ``cache``."""
    if cache is not None and cache.step is not None:
        return cache.step
    make = getattr(cost, "step_model", None)
    step = make(graph) if callable(make) else None
    if cache is not None:
        cache.step = step
    return step


def _switch_s(
    graph: MetaGraph, cost: CostModel, flows: Flows, op: OpSpec, n_star: float, cache: PricingCache
) -> float:
    """What changing an op's allocation mid-way roughly costs: re-sharding its activations
    from a group of its continuous-optimum size to one a device larger (forward, and
    backward if it trains); each (bytes, size) priced once in ``cache``."""
    N = graph.cluster.devices
    if N == 1:
        return 0.0
    n = max(1, min(N - 1, round(n_star)))
    key = (flows.carry_bytes[op.id], n)
    t = cache.switches.get(key)
    if t is None:
        t = cache.switches[key] = cost.transfer_seconds(
            key[0], range(n), range(n + 1), graph.cluster
        )
    return t * (2 if flows.backward[op.id] else 1)


def evaluate(ctx: PlanContext, sched: Schedule) -> Evaluated:
    """Place ``sched`` on devices and predict its iteration time."""
    placement = place(ctx.problem, sched, ctx.topology, ctx.ledger())
    return Evaluated(sched, placement, time_of(ctx, placement))


def transfer_of(ctx: PlanContext) -> Callable[[float, Sequence[int], Sequence[int]], float]:
    """The cost model's transfer time, each (bytes, source, destination) priced once per
    context family (``ctx.moves``)."""
    cost, cluster, moves = ctx.cost, ctx.graph.cluster, ctx.moves

    def transfer(nbytes: float, src: Sequence[int], dst: Sequence[int]) -> float:
        key = (nbytes, tuple(src), tuple(dst))
        got = moves.get(key)
        if got is None:
            got = moves[key] = cost.transfer_seconds(nbytes, src, dst, cluster)
        return got

    return transfer


def allreduce_of(ctx: PlanContext) -> Callable[[float, Sequence[int]], float]:
    """The cost model's all-reduce time, each (bytes, device tuple) priced once per context
    family (``ctx.reductions``): a plan's shared modules ask about 40 of them, the same
    holder sets in every candidate, and one across nodes counts each node's members. Groups
    over ``REDUCTIONS_KEPT`` devices are priced each time: their key costs as much as the
    price, and at 65,536 devices the keys would hold gigabytes."""
    cost, cluster, known = ctx.cost, ctx.graph.cluster, ctx.reductions

    def allreduce(nbytes: float, devices: Sequence[int]) -> float:
        if len(devices) > REDUCTIONS_KEPT:
            return cost.allreduce_seconds(nbytes, devices, cluster)
        key = (nbytes, tuple(devices))
        got = known.get(key)
        if got is None:
            got = known[key] = cost.allreduce_seconds(nbytes, devices, cluster)
        return got

    return allreduce


def time_of(ctx: PlanContext, placement: Placement) -> Timing:
    """The iteration time of ``placement`` under ``ctx``'s levers (the step model's). Moves
    and all-reduces are priced once per context family (``transfer_of``, ``allreduce_of``):
    the candidates a search places repeat most of them, and pricing a re-shard walks both
    splits."""
    return time_placement(
        placement,
        lambda op, n: ctx.problem.op(op).t(n),
        ctx.flows,
        transfer_of(ctx),
        allreduce_of(ctx),
        ctx.step,
        micro_batches=ctx.levers.micro_batches,
        zero_stage=ctx.levers.zero_stage,
    )


def evaluate_cached(ctx: PlanContext, sched: Schedule) -> Evaluated:
    """``evaluate``, once per context and set of waves (placement and timing depend only on
    the waves; the lever search and the final round judge the same schedules repeatedly)."""
    memo: dict[tuple, Evaluated] = ctx.evaluated
    if sched.waves not in memo:
        memo[sched.waves] = evaluate(ctx, sched)
    ev = memo[sched.waves]
    return ev if ev.schedule is sched else replace(ev, schedule=sched)


def compute_floor(ctx: PlanContext, sched: Schedule) -> float:
    """What ``sched`` takes at least once placed and timed under ``ctx``, without placing it:
    k passes of its waves' compute (``Schedule.compute_s``), which the step model's iteration
    is never below, and which device renamings and loss spreading leave as it is; 0 without a
    step model."""
    if ctx.step is None:
        return 0.0
    return ctx.levers.micro_batches * sched.compute_s(ctx.problem)


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
    the levers (``micro_batches``, ``zero_stage``, per-MetaOp ``recompute``) and the
    ``extra`` fields ``make_plan`` adds: ``scheduler`` (asked for), ``candidates_s``
    (iteration time of every schedule considered), ``level_reference_s`` (sum over
    MetaLevels of the continuous optimum, times k), ``solver_notes``, ``baseline_levers``,
    ``baselines_overflow`` (the baselines reported at a plan that overflows memory) and
    ``bounds``; with a step model also ``step_model`` (``step_model_record``)."""
    graph = ctx.graph
    metaops = tuple(
        PlanMetaOp.of(
            m,
            tuple(zip(ctx.problem.op(m.id).ns, ctx.problem.op(m.id).seconds, strict=True)),
            recompute=m.id in ctx.recompute,
            layouts=tuple((n, ctx.curves[m.id].layout(n)) for n in ctx.problem.op(m.id).ns),
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
        micro_batches=ctx.levers.micro_batches,
        zero_stage=ctx.levers.zero_stage,
        loss_devices=chosen.placement.loss_groups,
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
            "reduction_overlap": step.overlaps_reduction,
            "grad_in_curves": step.grad_in_curves,
            "wave_extra_s": list(t.wave_extra),
            "entry_extra_s": [list(e) for e in t.entry_extra],
            "wave_transfer_s": list(t.wave_transfer),
        }
    }
