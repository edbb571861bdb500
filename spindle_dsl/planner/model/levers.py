"""What one planning call may pull: the memory levers and the curves of one micro-batch pass
they are priced by, the ``milp`` scheduler's passes (``PassOptions``), and the call's time
(``Budget``).

Three levers trade time for memory, and the torch backend carries out each of them as the plan
says (``Plan.micro_batches``, ``Plan.zero_stage``, ``PlanMetaOp.recompute``):

* micro-batches (gradient accumulation): the waves run ``k`` times per iteration, each pass on
  ``ceil(B / k)`` samples of a task's batch ``B`` (the runtime's ceil split), so activations
  kept for backward shrink about k-fold, while every pass pays per-layer overheads and runs
  smaller, less efficient layers. Curves are priced by evaluating the cost model on the
  *micro-batch view* of the graph (``micro_graph``: each MetaOp carries the micro-batch),
  which puts the efficiency lost to small batches into the prediction;
* the ZeRO stage: 1 shards each parameter part's optimizer state over the devices holding the
  part, 2 its gradients too, 0 nothing (``cost.memory``);
* activation recompute per MetaOp (full per-layer checkpointing: one more forward).

Gradient reduction happens once per iteration, not once per pass: with ZeRO stage 0 or 1 the
runtime reduces after the last pass; with ZeRO-2 every pass reduce-scatters into the gradient
shard and the step all-gathers once, (k + 1) / 2 all-reduces' worth of traffic
(``cost.step.reductions_per_step``, the one place this rule lives). Where a cost model's curves
carry each layer's gradient all-reduce (the analytic model), a pass's curve is the layer's time
without it plus the pass's share of it (``reduction_share``): what ``k x waves`` then adds up to
is the k passes with the reduction counted as often as the runtime runs it. Curves without it (a
profile's) are unchanged by the share, and the step model prices the buckets itself. A
contrastive task's MetaOps also run one no-grad forward per micro-batch when k > 1 (the
runtime's GradCache-style exact loss), priced as the forward's share of the layer's time.

What one planning call may run: the ``milp`` scheduler's passes, and its time.

The ``milp`` scheduler (``search.rounds.milp_schedule``) chains several passes, each kept only
where it improves the plan. ``bench/plan_quality.py --ablation`` plans with each switched off in
turn and prints the iteration and planning time, so that a pass that does not pay can be seen
(and dropped). Planning uses ``ALL_PASSES`` unless a caller asks otherwise; the switches
are for measurement, not a user-facing option.

A ``Budget`` is the whole call's time (``--time-limit``): the search's optional steps start
only while their share of it is unspent (``search.make``, ``search.leversearch``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields, replace

from spindle_dsl.cost.analytic import backward_multiplier, backward_share
from spindle_dsl.cost.base import CostModel, Curve, Curves, has_slice_memory
from spindle_dsl.cost.comm import ceil_div
from spindle_dsl.cost.step import StepModel, reductions_per_step
from spindle_dsl.metagraph import MetaGraph, MetaOp
from spindle_dsl.planner.model.problem import OpSpec, Problem

MAX_MICRO_BATCHES = 256  # the search never goes past this many passes unless forced


@dataclass(frozen=True)
class Levers:
    """One setting of the memory levers (what a PlanContext is priced under)."""

    micro_batches: int = 1
    zero_stage: int = 1
    recompute: frozenset[str] = frozenset()

    def describe(self, total_ops: int) -> str:
        """'k=4, ZeRO-2, recompute 3/12' (for notes and tables)."""
        return (
            f"k={self.micro_batches}, ZeRO-{self.zero_stage}, "
            f"recompute {len(self.recompute)}/{total_ops}"
        )


NO_LEVERS = Levers()  # one pass, ZeRO-1, nothing recomputed: what a plan does by default


def micro_batch(batch: int, k: int) -> int:
    """The largest of the ``k`` contiguous ceil-split micro-batches of ``batch`` samples."""
    return ceil_div(batch, k) if batch > 0 else 0


def _micro_op(op: MetaOp, k: int) -> MetaOp:
    b = micro_batch(op.batch, k)
    per_sample = op.forward_flops_per_layer / op.batch if op.batch else 0.0
    return replace(op, batch=b, forward_flops_per_layer=per_sample * b)


def micro_graph(graph: MetaGraph, k: int) -> MetaGraph:
    """The graph as one pass of ``k`` micro-batches sees it: every MetaOp and task carries
    ``ceil(batch / k)`` samples (the plan keeps the whole batch on its MetaOps)."""
    if k == 1:
        return graph
    return replace(
        graph,
        metaops=tuple(_micro_op(op, k) for op in graph.metaops),
        tasks=tuple(replace(t, batch=micro_batch(t.batch, k)) for t in graph.tasks),
    )


def _without_gradient_sync(graph: MetaGraph) -> MetaGraph:
    """The same MetaOps with no parameter bytes to all-reduce: the cost models price a
    layer's gradient all-reduce from ``param_bytes_per_layer`` (memory reads
    ``params_per_layer``), so these curves are the layers' times without it."""
    return replace(
        graph, metaops=tuple(replace(op, param_bytes_per_layer=0) for op in graph.metaops)
    )


def micro_batch_choices(graph: MetaGraph, limit: int = MAX_MICRO_BATCHES) -> tuple[int, ...]:
    """k = 1, 2, 4, ... while the largest task's micro-batch still shrinks (at most
    ``limit``)."""
    largest = max((op.batch for op in graph.metaops), default=1)
    out = [1]
    while out[-1] < largest and 2 * out[-1] <= limit:
        out.append(2 * out[-1])
    return tuple(out)


def reduction_share(levers: Levers) -> float:
    """The share of one gradient all-reduce each pass pays: the step's reductions
    (``cost.step.reductions_per_step``) spread over its k passes."""
    k = levers.micro_batches
    return reductions_per_step(k, levers.zero_stage) / k


def contrastive_ops(graph: MetaGraph) -> frozenset[str]:
    """MetaOps of tasks with a contrastive loss (they run an extra no-grad forward per pass
    when the batch is split into micro-batches)."""
    tasks = {t.name for t in graph.tasks if t.loss == "contrastive"}
    return frozenset(op.id for op in graph.metaops if op.task in tasks)


def _curves(cost: CostModel, graph: MetaGraph, recompute: frozenset[str]) -> Curves:
    if has_slice_memory(cost):
        return cost.curves(graph, recompute=recompute)  # type: ignore[call-arg]
    return cost.curves(graph)


class PricingCache:
    """What pricing one graph under many lever settings shares: the micro-batch views and
    every MetaOp's pass curve (and the planner's ``OpSpec``) per (k, ZeRO stage, recompute),
    so a setting that changes a few MetaOps' recompute prices only those."""

    def __init__(self, graph: MetaGraph):
        self.graph = graph
        self._views: dict[tuple[int, bool], MetaGraph] = {}
        self.curves: dict[tuple[str, int, int, bool], Curve] = {}
        # every MetaOp's curves per (k, ZeRO stage, recompute set): asked once per MetaOp
        # where a caller reads one MetaOp's curve at a time
        self.settings: dict[tuple[int, int, frozenset[str]], Curves] = {}
        self.specs: dict[tuple, object] = {}  # ``build`` keeps its OpSpecs here
        self.source = "analytic"  # where the cost model's curves come from
        self.step: StepModel | None = None  # the step model of the graph (``build.step_of``)
        self.moves: dict = {}  # priced activation moves (``build.time_of``)
        self.slices: dict = {}  # slice memory under the levers it reads (``PlanContext``)
        self.reductions: dict = {}  # priced all-reduces (``build.allreduce_of``)
        self.orders: dict = {}  # groups in shard order (``placement.Topology.orders``)
        self.optima: dict = {}  # each level's continuous optimum (``build.context``)
        self.switches: dict = {}  # re-shard prices of a group one device larger (``build``)

    def priced_only(self) -> PricingCache:
        """A copy of what pricing settings shares (the views, curves, specs, re-shard prices,
        the step model), without what placements memoise or what is keyed by object
        identity: for another process to price more settings of the same graph (a helper's
        lower bound), sent with the graph and cost model it was priced from. Its dicts are
        copies, so this process may go on adding to its own while the copy is sent."""
        out = PricingCache(self.graph)
        out._views = dict(self._views)
        out.curves = dict(self.curves)
        out.settings = dict(self.settings)
        out.specs = dict(self.specs)
        out.switches = dict(self.switches)
        out.source, out.step = self.source, self.step
        return out

    def view(self, k: int, bare: bool = False) -> MetaGraph:
        """The micro-batch view at k (``bare``: without gradient bytes to all-reduce)."""
        key = (k, bare)
        if key not in self._views:
            g = micro_graph(self.graph, k)
            self._views[key] = _without_gradient_sync(g) if bare else g
        return self._views[key]


def pass_curves(
    graph: MetaGraph, cost: CostModel, levers: Levers, cache: PricingCache | None = None
) -> Curves:
    """T_m(n) of one pass under ``levers``: the micro-batch view's curves, with the gradient
    all-reduce counted at the pass's share and a contrastive MetaOp's extra forward."""
    cache = cache if cache is not None and cache.graph is graph else PricingCache(graph)
    k, z = levers.micro_batches, levers.zero_stage
    rc = levers.recompute
    whole = (k, z if k > 1 else 1, rc)
    got = cache.settings.get(whole)
    if got is not None:
        return got
    key = {op.id: (op.id, k, z if k > 1 else 1, op.id in rc) for op in graph.metaops}
    missing = [op.id for op in graph.metaops if key[op.id] not in cache.curves]
    if missing:
        for op_id, c in _price(cache, cost, levers, frozenset(missing)).items():
            cache.curves[key[op_id]] = c
    got = Curves(tuple(cache.curves[key[op.id]] for op in graph.metaops), source=cache.source)
    cache.settings[whole] = got
    return got


def _price(
    cache: PricingCache, cost: CostModel, levers: Levers, ids: frozenset[str]
) -> dict[str, Curve]:
    """Pass curves of the MetaOps ``ids`` (see ``pass_curves``)."""
    k = levers.micro_batches
    rc = levers.recompute & ids
    # the MetaOps priced and those they read from (a curve may depend on its inputs' ops:
    # ``cost.profile.first_layer_saving``); only the first are returned
    sources = {i.source for op in cache.graph.metaops if op.id in ids for i in op.inputs}
    keep = ids | sources

    def sub(g: MetaGraph) -> MetaGraph:
        return replace(g, metaops=tuple(op for op in g.metaops if op.id in keep))

    micro = sub(cache.view(k))
    full = _curves(cost, micro, rc)
    cache.source = full.source
    if k == 1:
        return {c.metaop: c for c in full if c.metaop in ids}
    bare = _curves(cost, sub(cache.view(k, bare=True)), rc)
    share = reduction_share(levers)
    extra = contrastive_ops(cache.graph)
    out = {}
    for op in (op for op in micro.metaops if op.id in ids):
        bare_at = dict(bare[op.id].items())
        fwd = 1.0
        if op.id in extra:
            fwd += 1.0 / backward_multiplier(op, op.id in rc)
        points = [
            (n, fwd * (t0 + max(0.0, t1 - t0) * share))
            for n, t1 in full[op.id].items()
            if (t0 := bare_at.get(n)) is not None
        ]
        ns = tuple(n for n, _ in points)
        layouts = tuple(full[op.id].layout(n) for n in ns)
        out[op.id] = Curve(op.id, ns, tuple(s for _, s in points), layouts)
    return out


def spec_of(op: MetaOp, points: list[tuple[int, float]]) -> OpSpec:
    """The planner's view of ``op`` with the curve ``points`` (n, seconds per layer)."""
    ns = tuple(n for n, _ in points)
    return OpSpec(
        op.id,
        op.layers,
        op.deps,
        ns,
        tuple(t for _, t in points),
        task=op.task,
        backward_share=backward_share(op),
    )


def pass_problem(
    graph: MetaGraph, cost: CostModel, levers: Levers, cache: PricingCache | None = None
) -> Problem:
    """One pass's problem with every allocation the curves hold, memory aside (for bounds)."""
    N = graph.cluster.devices
    curves = pass_curves(graph, cost, levers, cache)
    ops = [
        spec_of(op, [(n, t) for n, t in curves[op.id].items() if n <= N]) for op in graph.metaops
    ]
    return Problem(tuple(ops), N)


@dataclass(frozen=True)
class Budget:
    """The seconds one planning call may take, from ``start`` (``time.perf_counter``).

    What a plan needs runs whatever the clock says (the first setting of the levers that
    fits, one round at it, the lower bound); each step that only may improve the plan or its
    report asks ``within(share)`` first, the shares growing along the search, so that the
    steps that pay most come first and the call ends near ``seconds`` at any size."""

    start: float
    seconds: float

    @classmethod
    def starting_now(cls, seconds: float) -> Budget:
        return cls(time.perf_counter(), seconds)

    def spent(self) -> float:
        return time.perf_counter() - self.start

    @property
    def end(self) -> float:
        """When the call's time is up (``time.perf_counter``)."""
        return self.start + self.seconds

    def left(self) -> float:
        return max(0.0, self.seconds - self.spent())

    def within(self, share: float) -> bool:
        """Whether less than ``share`` of the budget is spent: a step may start."""
        return self.spent() < share * self.seconds


UNLIMITED = Budget(0.0, math.inf)


@dataclass(frozen=True)
class PassOptions:
    """Which passes run (all by default).

    ``cross_starts``: the starts besides the waves level by level: three that ignore
    MetaLevels (CPA list scheduling, the task-parallel chains, the tasks side by side with
    their branches side by side) and the levels packed with short MetaOps in turn on shared
    devices (off: only the level-by-level start and the paper's plan).
    ``global_milp``: one MILP over all waves with precedence, warm-started from the best
    start (``improve.wave_milp``).
    ``resplit``: the LP/MILP re-split of layers between a schedule's pieces (in ``improve``
    and after a polish edit that dissolves a wave).
    ``polish``: local search on the placed plan's iteration time.
    ``on_cores``: where CPU workers share fewer cores, the stages run on as many workers as
    cores too, each run at half the time, and the better placed plan is kept (off: every
    worker only; GPU plans never run it).
    ``match_cuts``: after placement, on every candidate of a round: the renamings of devices
    at wave boundaries that put pieces where their inputs are, in the search over renamings
    that weighs them against the loss phase's (``planner.evaluate.relabel``; off: the loss
    phase's renamings alone).
    """

    cross_starts: bool = True
    global_milp: bool = True
    resplit: bool = True
    polish: bool = True
    on_cores: bool = True
    match_cuts: bool = True

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def without(self, name: str) -> PassOptions:
        """These options with pass ``name`` switched off."""
        if name not in self.names():
            raise ValueError(f"unknown pass '{name}' (choose from {', '.join(self.names())})")
        return replace(self, **{name: False})


ALL_PASSES = PassOptions()
NO_PASSES = PassOptions(**dict.fromkeys(PassOptions.names(), False))

__all__ = ["ALL_PASSES", "NO_PASSES", "UNLIMITED", "Budget", "PassOptions"]
