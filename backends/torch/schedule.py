"""The plan compiled into what every rank must do: stages, data flows and parameter holders.

Every rank computes the same ``Schedule`` from the same (graph, plan, world size), so that all
of them agree, without talking, on who sends which rows to whom in every exchange phase and on
which ranks hold (and must reduce) each parameter. It is plain Python with no torch, so it is
cheap to test on its own.

Execution model. An entry runs the layout the plan gives its MetaOp on that many devices
(``PlanMetaOp.layout_at``): ``dp`` data-parallel replicas of ``tp``-way tensor-parallel layers.
Data parallel (``tp = 1``): device ``i`` of the entry's ``devices`` holds the ``i``-th
contiguous ceil-split shard of the MetaOp's batch. Tensor parallel: the stage keeps the first
``dp * tp`` devices (the rest idle), consecutive runs of ``tp`` of them form a tensor-parallel
group, and every device of group ``g`` holds the ``g``-th shard of the batch (whole rows). A
group's first device, its *lead*, is the one that sends and receives its rows and runs its
input stages; it hands the other members the stage's input and, backward, the gradient of its
output (``executor.py``). Every member holds the stage's layers whole and runs its slice of
them (``tensor_parallel.py``); an lm sink's group scores its loss together, each member its
slice of the vocabulary (``vocab_split_sinks``), and sums the gradients of its output.

Data crosses groups in four places: the output of a MetaOp's last entry flows to the first
entry of each consumer; a MetaOp split over several waves hands its activations from one
entry to the next; a contrastive loss gathers the two pooled sink outputs of its task onto one
device; and an lm sink whose loss the plan spreads (``Plan.loss_devices``) re-splits the
positions its head reads over its loss devices, position by position (``LM_LOSS_FLOW``,
``Flow.src_unit``), which hold the head.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, replace
from functools import cached_property

from spindle_dsl.cost.memory import lm_text_tokens
from spindle_dsl.errors import ExecutionError
from spindle_dsl.kinds import get_kind
from spindle_dsl.kinds.tp_split import tp_ok
from spindle_dsl.metagraph import MetaGraph, MetaOp
from spindle_dsl.plan.model import Plan

from .parts import Part, graph_parts, head_module, tied_stage

LM_LOSS_FLOW = "lmloss:"  # key prefix of a spread lm sink's head inputs (then the sink's id)


def shard_bounds(batch: int, n: int) -> tuple[tuple[int, int], ...]:
    """Rows ``[lo, hi)`` of each of ``n`` contiguous ceil-split shards (the last may be short
    or empty)."""
    size = -(-batch // n) if n else 0
    return tuple((min(i * size, batch), min((i + 1) * size, batch)) for i in range(n))


@dataclass(frozen=True)
class Move:
    """Rows ``[lo, hi)`` of a batch that go from device ``src`` to device ``dst``."""

    src: int
    dst: int
    lo: int
    hi: int


def unit_bounds(batch: int, n: int, unit: int = 1) -> tuple[tuple[int, int], ...]:
    """``shard_bounds`` of ``batch`` elements split in whole units of ``unit`` (a row of
    ``unit`` positions stays on one device)."""
    if unit == 1:
        return shard_bounds(batch, n)
    return tuple((a * unit, b * unit) for a, b in shard_bounds(batch // unit, n))


def moves(
    batch: int, src: tuple[int, ...], dst: tuple[int, ...], src_unit: int = 1
) -> tuple[Move, ...]:
    """Every non-empty overlap between a source shard and a destination shard (the source
    split in whole units of ``src_unit`` elements, the destination element by element)."""
    out = []
    for s, (a, b) in zip(src, unit_bounds(batch, len(src), src_unit), strict=True):
        for d, (c, e) in zip(dst, shard_bounds(batch, len(dst)), strict=True):
            lo, hi = max(a, c), min(b, e)
            if lo < hi:
                out.append(Move(s, d, lo, hi))
    return tuple(out)


@dataclass(frozen=True)
class Stage:
    """One plan entry: layers ``[first, end)`` of ``metaop`` on ``devices`` in wave ``wave``."""

    metaop: str
    index: int  # position in the MetaOp's chain of entries
    wave: int
    first: int
    end: int
    devices: tuple[int, ...]  # the busy devices: dp * tp of them
    last: bool  # runs the MetaOp's final layer
    tp: int = 1  # tensor-parallel degree: each run of ``tp`` devices shares its rows

    def rows(self, batch: int, rank: int) -> tuple[int, int]:
        """The batch rows ``rank`` holds in this stage (its group's shard)."""
        return shard_bounds(batch, len(self.leads))[self.devices.index(rank) // self.tp]

    @property
    def leads(self) -> tuple[int, ...]:
        """The first device of each tensor-parallel group: the devices rows move between."""
        return self.devices[:: self.tp]

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """The tensor-parallel groups (each device alone when ``tp = 1``)."""
        return tuple(self.devices[i : i + self.tp] for i in range(0, len(self.devices), self.tp))

    def group_of(self, rank: int) -> tuple[int, ...]:
        i = self.devices.index(rank)
        return self.devices[i - i % self.tp : i - i % self.tp + self.tp]


@dataclass(frozen=True)
class Flow:
    """Activations moving from one device group to another at the start of a phase.

    ``phase`` is the wave whose entries consume it (``n_waves`` for the loss phase). When
    ``backward`` is set, the gradients of the same rows travel back along it in reverse.
    """

    key: str
    phase: int
    batch: int
    src: tuple[int, ...]
    dst: tuple[int, ...]
    tail: tuple[int, ...]  # shape of one sample (tokens, width), or (width,) for a readout
    source: tuple[str, int]  # (metaop, stage index) that produced the rows
    backward: bool
    # elements per source row: 1 for batch rows; a spread lm loss moves positions, ``batch``
    # rows x positions of them, split by row over the source and by position over ``dst``
    src_unit: int = 1

    @property
    def moves(self) -> tuple[Move, ...]:
        return moves(self.batch, self.src, self.dst, self.src_unit)

    def bounds(self, rank: int, *, source: bool) -> tuple[int, int]:
        """The elements ``rank`` holds on the flow's source side (``source``) or its
        destination side."""
        if source:
            return unit_bounds(self.batch, len(self.src), self.src_unit)[self.src.index(rank)]
        return shard_bounds(self.batch, len(self.dst))[self.dst.index(rank)]

    def involves(self, rank: int) -> bool:
        return rank in self.src or rank in self.dst


def layer_module(op: MetaOp, layer: int) -> tuple[str, int]:
    """The (module, layer within the module) that global layer ``layer`` of ``op`` runs."""
    base = layer
    for name, count in op.segments:
        if base < count:
            return name, base
        base -= count
    raise ExecutionError(f"{op.id} has {op.layers} layers, not {layer + 1}")


def shape_after(graph: MetaGraph, op: MetaOp, layer: int) -> tuple[int, int]:
    """(tokens, width) of one sample after global layer ``layer`` (-1: the MetaOp's input).

    Widths change at a module's first layer and tokens at its last (where ``out_tokens``
    pools) and, where the input stage adds or merges tokens, in its layers
    (``Kind.layer_tokens``), which is how the built-in kinds stack; the executor checks
    every real shape against this and names the kind if one disagrees.
    """
    tokens, width = op.tokens, op.in_width
    done = 0
    for name, count in op.segments:
        if layer < done:
            break
        info = graph.module(name)
        kind, args = get_kind(info.kind), dict(info.args)
        width = kind.out_width(args)
        if layer >= done + count - 1:
            tokens = kind.out_tokens(args, tokens)
        else:  # inside the module: as many as its input stage makes (a CLS token, a stem)
            tokens = kind.layer_tokens(args, tokens)
        done += count
    return tokens, width


@dataclass(frozen=True)
class Schedule:
    """Everything about a plan that every rank must agree on."""

    world_size: int
    n_waves: int
    chains: tuple[tuple[str, tuple[Stage, ...]], ...]  # per active MetaOp, its stages in order
    flows: tuple[Flow, ...]
    holders: tuple[tuple[Part, tuple[int, ...]], ...]  # each parameter part and who holds it
    loss_devices: tuple[tuple[str, tuple[int, ...]], ...]  # where each task's loss is computed
    vocab_split: frozenset[str] = frozenset()  # lm sinks scored split by vocabulary

    @cached_property
    def _chains(self) -> dict[str, tuple[Stage, ...]]:
        return dict(self.chains)

    def chain(self, metaop: str) -> tuple[Stage, ...]:
        return self._chains[metaop]

    @cached_property
    def holder_map(self) -> dict[Part, tuple[int, ...]]:
        return dict(self.holders)

    def parts_of(self, rank: int) -> tuple[Part, ...]:
        """The parameter parts ``rank`` builds, trains and reduces."""
        return tuple(p for p, ranks in self.holders if rank in ranks)

    def stages_in_wave(self, wave: int) -> tuple[Stage, ...]:
        return tuple(s for _, chain in self.chains for s in chain if s.wave == wave)

    def stage_of(self, rank: int, wave: int) -> Stage | None:
        """The stage ``rank`` runs in ``wave`` (a wave uses each device at most once)."""
        return next((s for s in self.stages_in_wave(wave) if rank in s.devices), None)

    def flows_into(self, phase: int) -> tuple[Flow, ...]:
        return tuple(f for f in self.flows if f.phase == phase)

    @cached_property
    def tp_groups(self) -> tuple[tuple[int, ...], ...]:
        """Every tensor-parallel group of ranks some stage runs (sorted, no repeats)."""
        found = {g for _, chain in self.chains for s in chain if s.tp > 1 for g in s.groups}
        return tuple(sorted(found))

    def loss_group(self, task: str) -> tuple[int, ...]:
        return dict(self.loss_devices)[task]


def active_ops(graph: MetaGraph) -> tuple[MetaOp, ...]:
    """MetaOps with samples to process (a task the mix leaves out gets a batch of 0)."""
    return tuple(m for m in graph.metaops if m.batch > 0)


def build_schedule(graph: MetaGraph, plan: Plan, world_size: int) -> Schedule:
    """Check that ``plan`` fits ``graph`` and ``world_size``, and compile it for the runtime."""
    _check_plan(graph, plan, world_size)
    ops = active_ops(graph)
    chains = _chains(graph, plan)
    n_waves = max((w.index for w in plan.waves), default=-1) + 1
    spread = dict(plan.loss_devices)
    flows = [f for op in ops for f in _activation_flows(graph, op, chains)]
    loss_flows, loss_devices = _loss_phase(graph, chains, spread, n_waves)
    flows += loss_flows
    vocab_split = vocab_split_sinks(graph, chains, spread)
    flows.sort(key=lambda f: f.phase)  # stable: creation order inside a phase
    return Schedule(
        world_size=world_size,
        n_waves=n_waves,
        chains=tuple((op.id, tuple(chains[op.id])) for op in ops),
        flows=tuple(flows),
        holders=_holders(graph, ops, chains, spread, vocab_split),
        loss_devices=tuple(loss_devices),
        vocab_split=vocab_split,
    )


def _chains(graph: MetaGraph, plan: Plan) -> dict[str, list[Stage]]:
    """Each MetaOp's stages in wave order, each running the layout the plan gives it."""
    chains: dict[str, list[Stage]] = defaultdict(list)
    layouts = {m.id: m for m in plan.metaops}
    for wave in sorted(plan.waves, key=lambda w: w.index):
        for e in wave.entries:
            op = graph.op(e.metaop)
            chain = chains[e.metaop]
            dp, tp = layouts[e.metaop].layout_at(len(e.devices))
            devices = e.devices[: dp * tp] if tp > 1 else e.devices
            last = e.end == op.layers
            chain.append(Stage(e.metaop, len(chain), wave.index, e.first, e.end, devices, last, tp))
    return chains


def _activation_flows(graph: MetaGraph, op: MetaOp, chains: dict[str, list[Stage]]) -> list[Flow]:
    """The rows ``op`` receives: each input MetaOp's output into its first stage, and each of
    its stages' output into the next."""
    chain = chains[op.id]
    head = chain[0]
    flows: list[Flow] = []
    for i, inp in enumerate(op.inputs):
        if inp.from_modality:
            continue
        dep = graph.op(inp.source)
        last = chains[dep.id][-1]
        flows.append(
            Flow(
                f"{op.id}<{i}",
                head.wave,
                op.batch,
                last.leads,
                head.leads,
                (dep.out_tokens, dep.out_width),
                (dep.id, last.index),
                dep.needs_backward,
            )
        )
    for prev, stage in itertools.pairwise(chain):
        flows.append(
            Flow(
                f"{op.id}#{stage.index}",
                stage.wave,
                op.batch,
                prev.leads,
                stage.leads,
                shape_after(graph, op, stage.first - 1),
                (op.id, prev.index),
                op.needs_backward,
            )
        )
    return flows


def _loss_phase(
    graph: MetaGraph,
    chains: dict[str, list[Stage]],
    spread: dict[str, tuple[int, ...]],
    n_waves: int,
) -> tuple[list[Flow], list[tuple[str, tuple[int, ...]]]]:
    """The loss phase's flows (spread lm head inputs, contrastive readouts) and the devices
    that compute each task's loss."""
    flows: list[Flow] = []
    loss_devices: list[tuple[str, tuple[int, ...]]] = []
    for task in graph.tasks:
        if task.batch <= 0:
            continue
        sinks = [chains[s][-1] for s in task.sinks]
        if task.loss == "lm":
            flows += [
                _spread_flow(graph, sink_id, last, spread[sink_id], task.batch, n_waves)
                for sink_id, last in zip(task.sinks, sinks, strict=True)
                if sink_id in spread
            ]
            sinks = [
                replace(last, devices=spread[sink_id], tp=1) if sink_id in spread else last
                for sink_id, last in zip(task.sinks, sinks, strict=True)
            ]
        if task.loss == "contrastive":
            group = (sinks[0].leads[0],)
            for i, (sink_id, last) in enumerate(zip(task.sinks, sinks, strict=True)):
                sink = graph.op(sink_id)
                flows.append(
                    Flow(
                        f"loss:{task.name}:{i}",
                        n_waves,
                        task.batch,
                        last.leads,
                        group,
                        (sink.out_width,),
                        (sink_id, last.index),
                        sink.needs_backward,
                    )
                )
        else:
            group = tuple(sorted({d for s in sinks for d in s.leads}))
        loss_devices.append((task.name, group))
    return flows, loss_devices


def _spread_flow(
    graph: MetaGraph, sink_id: str, last: Stage, to: tuple[int, ...], batch: int, phase: int
) -> Flow:
    """A spread lm sink's head inputs, re-split position by position over its loss devices."""
    sink = graph.op(sink_id)
    positions = lm_text_tokens(graph, sink) - 1  # what the head reads per row
    return Flow(
        f"{LM_LOSS_FLOW}{sink_id}",
        phase,
        batch * positions,
        last.leads,
        to,
        (sink.out_width,),
        (sink_id, last.index),
        sink.needs_backward,
        src_unit=positions,
    )


def vocab_split_sinks(
    graph: MetaGraph, chains: dict[str, list[Stage]], spread: dict[str, tuple[int, ...]]
) -> frozenset[str]:
    """The lm sinks whose head runs split by vocabulary: those whose last stage is tensor
    parallel and whose loss the plan does not spread. Every rank of such a group scores its
    slice of the vocabulary for the group's rows (``losses.vocab_parallel_lm_loss_part``)."""
    return frozenset(
        sink_id
        for task in graph.tasks
        if task.batch > 0 and task.loss == "lm"
        for sink_id in task.sinks
        if sink_id not in spread and chains[sink_id][-1].tp > 1
    )


def _holders(
    graph: MetaGraph,
    ops: tuple[MetaOp, ...],
    chains: dict[str, list[Stage]],
    spread: dict[str, tuple[int, ...]],
    vocab_split: frozenset[str],
) -> tuple[tuple[Part, tuple[int, ...]], ...]:
    """Parameter device groups: every rank that runs anything touching a part holds it (an
    LM head: the devices that score its sinks, the leads of their last entries, every rank
    of them where the head runs split by vocabulary, or their spread losses' devices). A
    tensor-parallel group's lead alone runs its input stages."""
    held: dict[Part, set[int]] = defaultdict(set)
    for op in ops:
        first_module = op.segments[0][0]
        for stage in chains[op.id]:
            for g in range(stage.first, stage.end):
                module, j = layer_module(op, g)
                held[Part(module, f"layer.{j}")].update(stage.devices)
            if stage.first == 0:
                for inp in op.inputs:
                    if inp.from_modality:
                        held[Part(first_module, f"input.{inp.source}")].update(stage.leads)
    for task in graph.tasks:
        if task.batch <= 0 or task.loss != "lm":
            continue
        for sink_id in task.sinks:
            module = head_module(graph.op(sink_id))
            last = chains[sink_id][-1]
            scorers = last.devices if sink_id in vocab_split else last.leads
            devices = (*scorers, *spread.get(sink_id, ()))
            held[Part(module, "head")].update(devices)
            tied = tied_stage(graph, module)
            if tied is not None:  # a tied head multiplies by that stage's embedding
                held[tied].update(devices)
    order = {p: i for i, p in enumerate(graph_parts(graph))}
    missing = [p for p in held if p not in order]
    if missing:
        raise ExecutionError(f"internal: parts {missing} are held but not in the model")
    return tuple((p, tuple(sorted(held[p]))) for p in sorted(held, key=order.__getitem__))


def _check_plan(graph: MetaGraph, plan: Plan, world_size: int) -> None:
    """Everything the runtime relies on, as one error listing each problem."""
    problems: list[str] = []
    if plan.cluster.devices != world_size:  # every device check below would repeat this one
        raise ExecutionError(
            f"cannot run this plan:\n  the plan is for {plan.cluster.devices} devices but "
            f"{world_size} processes run it; re-plan with --devices {world_size} or run with "
            f"--nproc {plan.cluster.devices}"
        )
    if plan.spec.sha256 and graph.spec_sha256 and plan.spec.sha256 != graph.spec_sha256:
        problems.append(
            f"the plan was made for another version of the spec (sha256 {plan.spec.sha256[:12]}"
            f"... vs {graph.spec_sha256[:12]}...); re-plan it"
        )
    ops = {m.id: m for m in active_ops(graph)}
    planned = {m.id: m for m in plan.metaops}
    for mid in sorted(set(ops) - set(planned)):
        problems.append(f"MetaOp {mid} of the spec is not in the plan")
    for mid in sorted(set(planned) - set(graph._ops)):
        problems.append(f"the plan has a MetaOp {mid} that the spec does not")
    for mid in sorted(set(ops) & set(planned)):
        a, b = ops[mid], planned[mid]
        if (a.layers, a.batch) != (b.layers, b.batch):
            problems.append(
                f"{mid}: the plan has {b.layers} layers x batch {b.batch}, "
                f"the spec {a.layers} x {a.batch}"
            )
    covered: dict[str, int] = {}
    last_wave: dict[str, int] = {}
    first_wave: dict[str, int] = {}
    for wave in sorted(plan.waves, key=lambda w: w.index):
        used: set[int] = set()
        for e in wave.entries:
            if e.metaop not in ops:
                continue
            bad = [d for d in e.devices if not 0 <= d < world_size]
            if bad or not e.devices:
                problems.append(f"wave {wave.index}: {e.metaop} uses devices {list(e.devices)}")
            if used & set(e.devices):
                problems.append(f"wave {wave.index}: devices {sorted(used & set(e.devices))} twice")
            used |= set(e.devices)
            if covered.get(e.metaop, 0) != e.first or e.end <= e.first:
                problems.append(
                    f"wave {wave.index}: {e.metaop} runs layers [{e.first}, {e.end}) but "
                    f"[0, {covered.get(e.metaop, 0)}) ran before"
                )
            covered[e.metaop] = e.end
            first_wave.setdefault(e.metaop, wave.index)
            last_wave[e.metaop] = wave.index
    for mid, op in ops.items():
        if mid in planned and covered.get(mid, 0) != op.layers:
            problems.append(f"{mid}: the plan covers {covered.get(mid, 0)} of {op.layers} layers")
        for dep in op.deps:
            if mid in first_wave and dep in last_wave and last_wave[dep] >= first_wave[mid]:
                problems.append(
                    f"{mid} starts in wave {first_wave[mid]} before its input {dep} ends "
                    f"(wave {last_wave[dep]})"
                )
    problems += _layout_problems(graph, plan, ops)
    lm_sinks = {s for t in graph.tasks if t.batch > 0 and t.loss == "lm" for s in t.sinks}
    for sink_id, devices in plan.loss_devices:
        if sink_id not in lm_sinks:
            problems.append(f"loss_devices names {sink_id}, which is not a sink of an lm task")
        elif not lm_text_tokens(graph, graph.op(sink_id)):
            problems.append(f"loss_devices names {sink_id}, whose loss reads no LM head")
        bad = [d for d in devices if not 0 <= d < world_size]
        if bad:
            problems.append(f"loss_devices of {sink_id} names devices {bad}")
    if problems:
        raise ExecutionError("cannot run this plan:\n  " + "\n  ".join(problems))


def _layout_problems(graph: MetaGraph, plan: Plan, ops: dict[str, MetaOp]) -> list[str]:
    """Tensor-parallel layouts the runtime cannot run: a degree the layers of a MetaOp's
    modules do not divide into (``tp_ok``)."""
    problems = []
    for m in plan.metaops:
        if m.id not in ops:
            continue
        for n, (_, tp) in m.layout_per_layer:
            if tp == 1:
                continue
            for name, _ in ops[m.id].segments:
                info = graph.module(name)
                why = tp_ok(info.kind, dict(info.args), tp)
                if why is not None:
                    problems.append(f"{m.id} on {n} devices runs module {name} {tp}-way: {why}")
    return problems
