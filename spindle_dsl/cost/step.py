"""One model of a training step: the waves, and everything the runtime does around them.

The curves T_m(n) price one layer's forward and backward. A step of the runtime
(``backends/torch``) does more, and this module prices each of it once, for the planner
(``planner.evaluate.timing`` via ``planner.evaluate.build``) and for the run summary and
``spindle compare`` alike, so that what a plan predicts and what a run is compared against are the
same sums. Each term is a field of the plan's ``breakdown`` and the breakdown adds up to
``iteration_s``:

- ``compute_s``: the waves, once per micro-batch pass. A pass runs every wave's forward, the
  losses, then every wave's backward in reverse, so a wave has two phases apart, each lasting
  as long as its slowest device in that phase: a wave's layers take the slowest forward plus
  the slowest backward, not the slowest forward+backward. The two differ where pieces side by
  side split their time differently: a frozen tower's layers run forward only (frozen_towers
  on 2 ranks: beside a tower's long forward, an LM layer's rank waits in the forward, and the
  tower's rank waits through the LM's backward, waiting that a wave priced as its slowest
  forward+backward would miss).
  A piece's layers split by its MetaOp's backward share (``OpStep.backward_share``: 2/3 when
  training weights, 1/2 for input gradients only, 0 without a backward). On a CPU node whose
  computing devices outnumber its cores, they share the cores
  (processor sharing: every running worker progresses at ``cores / running`` of a core, the
  way the OS time-slices single-threaded processes, slowed further by what taking turns
  costs, ``sharing_slowdown``, measured by the profile; a rank blocked in a gloo receive
  sleeps and costs nothing, measured), so a wave lasts the makespan of its devices' work on
  ``cores`` cores (``shared_makespan``).
- ``wave_overhead_s``: per wave, what a rank does beyond its layers, priced the same way:
  its MetaOp's input stages on the MetaOp's first entry (reading the raw batch, the
  embedding, patch or feature projection, forward and backward) and a fixed cost per stage
  (``wave_s``: the step loop's bookkeeping, the autograd call, the exchange handshake); and
  the expected wait for the wave's latest rank when each rank's stage strays by the measured
  ``rank_jitter`` (``cost.jitter``; none without it): ranks meet at the next exchange or
  collective, the ranks of one data-parallel group at their gradient buckets.
- ``transfer_s``: activations crossing device groups at wave boundaries
  (``planner.evaluate.timing``, with the cost model's point-to-point price). The runtime has no
  barrier between waves: only the ranks of a move take part in its exchange, so on cores of their
  own a move delays the groups it connects, and counts only where their stage with it outlasts the
  wave's slowest group; where devices share cores, every move counts after the wave.
- ``loss_s``: the loss phase after the last forward wave: each device computes the loss heads
  of the sinks whose last entry it runs (lm: vocab head and cross-entropy; mse; contrastive:
  pooled readouts, InfoNCE of the whole batch on one device), forward and backward; the
  busiest device counts (``loss_load`` gives each device's, which ``planner.evaluate.relabel``
  evens out). An lm sink's loss may be spread over more devices than its last entry's
  (``loss_groups``, chosen by ``planner.evaluate.relabel``, carried out by the runtime): the
  positions its head reads are re-split over the group, each device paying the loss on its
  share (``spread_shares``), and those inputs move there and their gradients back
  (``loss_moves``: seconds per device, priced by the planner with the cost model's
  transfers).
- ``grad_sync_s``: gradient reduction as the runtime issues it, and the step's closing
  all-reduce of the losses over every rank (which also lines the ranks up). A parameter part
  (a layer, an input stage, an LM head) is summed over the ranks holding it; parts with the
  same holders form buckets (capped in size), one collective each: a reduce-scatter then,
  after the update, an all-gather of the weights (ZeRO-1, ``zero_stage`` 1), an all-reduce
  (``zero_stage`` 0), or with ZeRO-2 a reduce-scatter in every micro-batch pass. A rank
  issues its buckets one after another, so the slowest rank's sum counts.
  ``cost.overheads.REDUCTION_OVERLAP`` says whether a bucket's reduction starts as soon as its
  parts' last backward is done on every holder and runs under the backward still to come (then
  only what sticks out past the backward counts), or only after the whole backward (the
  runtime before bucketed asynchronous reduction). "As soon as" is inside a stage: the runtime
  issues a bucket from the accumulation hook of its last gradient, as DDP does, and a piece's
  backward finishes its last layer first, so a bucket of a piece's later layers is ready part
  way into its wave's backward (``Held.lag_s``), not at the wave's end (an LM head's, after
  the loss, at once). Overlap needs something to run the collective beside the backward: a
  GPU's communication kernels, or on a CPU node a core that no device computes on (gloo's
  threads copy, sum and wait on sockets on the CPU). On a CPU
  node with no spare core (``spare_core``) the collectives issued during the backward make
  little progress until it ends (tiny_mm on 2 ranks over 2 cores waits for its gradients
  after a backward that issued them early), so they are priced after it.
- ``optimizer_s``: AdamW over what each rank owns (its ZeRO shard of every part it holds) plus
  the per-part work of every part it holds: with other holders, gradients into the flat
  buffer and weights out again, tensor by tensor; as its only holder, AdamW over each of the
  part's tensors in place (a cost per tensor, no copies); slowest rank. Under ZeRO-0 every
  holder owns the whole part and steps its tensors in place, having laid its gradients into
  the all-reduced flat buffer (one copy) when it has other holders.

With ``micro_batches`` k the waves, their overheads, the transfers and the losses run k times;
the reduction (unless ZeRO-2) and the optimizer once. Where the k-dependence of the gradient
reduction lives is decided once, by ``reductions_per_step`` (1 all-reduce's worth per step, or
(k + 1) / 2 under ZeRO-2: a reduce-scatter every pass, one all-gather): this model applies it to
the buckets it prices; when the curves carry each layer's all-reduce (``grad_in_curves``) the
planner's pass curves carry that layer's share of it per pass (``planner.model.levers``,
``reductions_per_step / k``) and the planner multiplies what shared modules add by it.
``StepOverheads`` holds the machine's figures: measured by ``spindle profile --nproc N`` on the
backend's own processes, or the analytic defaults of ``cost.overheads`` (assumptions, each
documented). A cost model whose curves already include the gradient all-reduce of every layer
(the analytic model, after Spindle's ``T(n) = alpha + beta c + beta' w / n``) says so with
``grad_in_curves``; the planner then adds only what summing shared modules costs beyond it, as
before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from spindle_dsl.cluster import Cluster, usable_cores
from spindle_dsl.cost import comm
from spindle_dsl.cost.jitter import expected_latest
from spindle_dsl.cost.overheads import StepOverheads
from spindle_dsl.cost.step_parts import OpStep, SinkLoss, op_steps, sink_losses
from spindle_dsl.metagraph import MetaGraph


@dataclass(frozen=True)
class PieceTime:
    """One piece of a wave as the step model sees it: layers ``[first, end)`` of ``op`` on
    ``devices``, whose layers take ``seconds`` (layers x T_op(n))."""

    op: str
    first: int
    end: int
    devices: tuple[int, ...]
    seconds: float


@dataclass(frozen=True)
class WaveMoves:
    """The activation moves at one wave's boundary, one pass, forward and backward: the
    busiest device's send or receive time each way (``busiest_s``, their sum); per piece of
    the wave, in its order, the most seconds one of its devices spends in them both ways
    (``per_piece``: a device sending waits for its sends as one receiving for its receives);
    and the most any device spends in them both ways (``device_s``: the stage of a rank that
    only hands its activations on, no piece of the wave on it)."""

    busiest_s: float
    per_piece: tuple[float, ...]
    device_s: float = 0.0


@dataclass
class Held:
    """A trainable part as the reduction sees it (mutable while the waves are read)."""

    nbytes: float  # its gradient
    devices: frozenset[int]  # the ranks holding it (shared between parts: never mutated)
    wave: int  # the earliest wave running it: its last backward ends there
    order: int  # when the forward pass first met it
    # how far into that wave's backward its last holder is done with it (seconds; inf: at the
    # wave's end): a piece's backward finishes its last layer first
    lag_s: float = float("inf")


@dataclass(frozen=True)
class StepPrice:
    """One step priced (seconds; per pass where it says so)."""

    durations: tuple[float, ...]  # per wave: its layers, cores shared (one pass)
    wave_extra: tuple[float, ...]  # per wave: input stages and stage costs on top (one pass)
    entry_extra: tuple[tuple[float, ...], ...]  # per wave and piece: its own extra, unshared
    loss_s: float  # one pass
    grad_sync_s: float  # the step's exposed gradient reduction (runtime-style)
    optimizer_s: float
    closing_s: float = 0.0  # the step's last collective: the losses summed over every rank
    wave_transfer: tuple[float, ...] = ()  # per wave: its moves not hidden by compute (one pass)
    backward_s: tuple[float, ...] = ()  # per wave: its backward phase, extras included (one pass)

    def backward_clock(self) -> BackwardClock:
        """The last pass's backward as this price timed it (``BackwardClock``)."""
        return backward_clock(self.backward_s)


@dataclass(frozen=True)
class BackwardClock:
    """The last pass's backward as a clock for reductions overlapped with it: backward runs the
    waves in reverse, each for its backward phase (``StepPrice.backward_s``); ``ends[w]`` is
    when wave w's backward ends, counted from the start of the backward."""

    ends: tuple[float, ...]
    total_s: float

    def ready_s(self, wave: int) -> float:
        """When a part whose last backward is in ``wave`` is ready (past the last wave: at
        once)."""
        return self.ends[wave] if wave < len(self.ends) else 0.0

    def start_s(self, wave: int) -> float:
        """When the backward of ``wave`` starts (that of the wave after it ends)."""
        return self.ready_s(wave + 1)


def backward_clock(phases: Sequence[float]) -> BackwardClock:
    """The clock of a backward whose waves' phases last ``phases`` seconds (in wave order;
    they run from the last wave to the first)."""
    ends = [0.0] * len(phases)
    t = 0.0
    for w in range(len(phases) - 1, -1, -1):
        t += phases[w]
        ends[w] = t
    return BackwardClock(tuple(ends), t)


def reductions_per_step(micro_batches: int, zero_stage: int) -> float:
    """Gradient reductions per step, in all-reduces' worth: the runtime reduces once after
    the last of ``micro_batches`` passes under ZeRO stages 0 and 1; under ZeRO-2 every pass
    reduce-scatters (half an all-reduce's traffic) into the gradient shard and the update
    all-gathers once, so (k + 1) / 2."""
    k = max(1, micro_batches)
    return (k + 1) / 2 if zero_stage == 2 else 1.0


def shared_makespan(lengths: Sequence[float], cores: int | None, slowdown: float = 1.0) -> float:
    """When jobs of these lengths (seconds on a core of their own) all start together on
    ``cores`` cores shared fairly, when the last ends (None: a core each). While more jobs
    run than there are cores, each progresses at ``cores / running`` of a core, further
    divided by ``slowdown`` (the measured cost of taking turns, ``sharing_slowdown``)."""
    jobs = sorted(x for x in lengths if x > 0)
    if not jobs:
        return 0.0
    if cores is None or len(jobs) <= cores:
        return jobs[-1]
    t = done = 0.0
    running = len(jobs)
    for length in jobs:
        rate = running / cores * slowdown if running > cores else 1.0
        t += (length - done) * rate
        done = length
        running -= 1
    return t


@dataclass(frozen=True)
class StepModel:
    """The step model of one graph on one cluster (``make_step_model``)."""

    overheads: StepOverheads
    cores: int | None  # cores one node's devices share (None: no sharing)
    devices_per_node: int
    devices: int  # ranks in the run
    grad_in_curves: bool  # the curves already carry each layer's gradient all-reduce
    ops: Mapping[str, OpStep]
    sinks: tuple[SinkLoss, ...]
    spare_core: bool = True  # a node has a core beside its devices' for collectives to run on

    @property
    def overlaps_reduction(self) -> bool:
        """Whether gradient reductions run under the backward (see the module docstring)."""
        return self.overheads.reduction_overlap and self.spare_core

    # -- per piece and per phase -------------------------------------------------------------
    def input_seconds(self, op_id: str, samples: int) -> float:
        """The input stages of ``op`` on a shard of ``samples``, forward and backward."""
        total = 0.0
        for stage in self.ops[op_id].inputs:
            line = self.overheads.input_line(stage.key)
            if line is not None:
                total += line.at(samples)
            elif samples > 0:
                total += stage.flops_per_sample * samples * self.overheads.seconds_per_flop
        return total

    def loss_seconds(self, sink: SinkLoss, samples: int) -> float:
        line = self.overheads.loss_line(sink.key)
        if line is not None:
            return line.at(samples)
        return sink.flops_per_sample * samples * self.overheads.seconds_per_flop if samples else 0.0

    @property
    def core_each(self) -> bool:
        """Whether every device of a node has a core of its own (GPUs; CPU nodes with at
        least as many cores as devices): then a makespan is the largest device's work."""
        return self.cores is None or self.cores >= self.devices_per_node

    @property
    def lanes(self) -> int:
        """How many devices' work the cluster advances at once: every device where each has a
        core of its own, else each node's cores (``shared_makespan`` runs a node's work at
        most ``cores`` at a time). Every makespan this model prices (a wave's phases, the loss
        phase, the optimizer) is at least the summed work over ``lanes``, which the lower
        bounds use (``planner.bound.lp_bound``, ``planner.bound.floors``)."""
        if self.core_each:
            return self.devices
        assert self.cores is not None
        per = self.devices_per_node
        full, last = divmod(self.devices, per)
        return full * min(per, self.cores) + min(last, self.cores)

    def _share(self, devices: Mapping[int, float]) -> float:
        """Makespan of per-device work, each node's devices sharing its cores."""
        if self.core_each:
            return max(max(devices.values(), default=0.0), 0.0)
        nodes: dict[int, list[float]] = {}
        for d, secs in devices.items():
            nodes.setdefault(d // self.devices_per_node, []).append(secs)
        slow = self.overheads.sharing_slowdown
        return max((shared_makespan(v, self.cores, slow) for v in nodes.values()), default=0.0)

    # -- the whole step ----------------------------------------------------------------------
    def price(
        self,
        waves: Sequence[Sequence[PieceTime]],
        *,
        micro_batches: int = 1,
        zero_stage: int = 1,
        moves: Sequence[WaveMoves] = (),
        loss_groups: Mapping[str, tuple[int, ...]] | None = None,
        loss_moves: Mapping[int, float] | None = None,
    ) -> StepPrice:
        """Price one step of these waves (see the module docstring for each term); ``moves``
        are the activation moves at each wave's boundary (none where absent); ``loss_groups``
        the lm sinks whose loss is spread over other devices than their last entry's, and
        ``loss_moves`` what moving their rows there and back costs each device (one pass)."""
        k = max(1, micro_batches)
        durations, extras, entry_extra, exposed, backward = [], [], [], [], []
        for wi, wave in enumerate(waves):
            move = moves[wi] if wi < len(moves) else None
            mine = [self._entry_extra(p, k) for p in wave]
            base, whole, backward_s, shown = self._wave(wave, mine, move)
            base = max(base, 0.0)
            durations.append(base)
            extras.append(max(whole - base, 0.0))
            entry_extra.append(tuple(mine))
            backward.append(max(backward_s, 0.0))
            exposed.append(shown)
        holders = self._holders(waves, loss_groups)
        tasks = len({s.task for s in self.sinks})
        return StepPrice(
            tuple(durations),
            tuple(extras),
            tuple(entry_extra),
            self._share(self.loss_load(waves, k, loss_groups, loss_moves)),
            self._reduction(holders, backward, k, zero_stage),
            self._optimizer(holders, zero_stage),
            self.overheads.all_reduce.seconds(8.0 * max(tasks, 1), self.devices),
            tuple(exposed),
            tuple(backward),
        )

    def _entry_extra(self, p: PieceTime, k: int) -> float:
        """A piece's time beyond its layers: the wave overhead, and its op's input stages
        where the piece starts the op."""
        op = self.ops[p.op]
        extra = self.overheads.wave_s
        if p.first == 0 and op.inputs:
            extra += self.input_seconds(p.op, _shard(op.batch, k, len(p.devices)))
        return extra

    def _wave(
        self, wave: Sequence[PieceTime], mine: list[float], move: WaveMoves | None
    ) -> tuple[float, float, float, float]:
        """One wave's (layers' duration, whole duration, backward phase, moves shown). Its
        forward and its backward run apart (all forwards, the losses, then the backwards in
        reverse): each phase lasts as long as its own slowest stage (module docstring), a
        piece's layers and extras split by its op's backward share."""
        phases = [self._phases(p, extra) for p, extra in zip(wave, mine, strict=True)]
        if not (self.core_each and _disjoint(wave)):  # devices time-sliced over a node's
            # cores, or a hand-made overlapping wave
            layers: tuple[dict[int, float], ...] = ({}, {})
            total: tuple[dict[int, float], ...] = ({}, {})
            for p, f in zip(wave, phases, strict=True):
                for d in p.devices:
                    for i in (0, 1):
                        layers[i][d] = layers[i].get(d, 0.0) + f[i]
                        total[i][d] = total[i].get(d, 0.0) + f[i] + f[i + 2]
            base = self._share(layers[0]) + self._share(layers[1])
            backward_s = self._share(total[1])
            shown = move.busiest_s if move is not None else 0.0
            return base, self._share(total[0]) + backward_s, backward_s, shown
        busy = [(p, f) for p, f in zip(wave, phases, strict=True) if p.devices]
        ranks = [len(p.devices) for p, _ in busy]
        # (never below the slowest piece whole, which rounding could put it under)
        base = max(
            sum(max((f[i] for _, f in busy), default=0.0) for i in (0, 1)),
            max((p.seconds for p, _ in busy), default=0.0),
        )
        longest = max(
            sum(max((f[i] + f[i + 2] for _, f in busy), default=0.0) for i in (0, 1)),
            max((sum(f) for _, f in busy), default=0.0),
        )
        # every rank's stage strays, and ranks meet at the next exchange or collective, in
        # each phase: the latest of them (``cost.jitter``)
        forward_s, backward_s = (
            expected_latest([f[i] + f[i + 2] for _, f in busy], self.overheads.rank_jitter, ranks)
            for i in (0, 1)
        )
        shown = _moves_exposed(wave, mine, move, longest)
        return base, forward_s + backward_s, backward_s, shown

    def _phases(self, p: PieceTime, extra: float) -> tuple[float, float, float, float]:
        """(forward layers, backward layers, forward extras, backward extras) of piece ``p``
        with ``extra`` seconds of input stages and stage costs, split by its op's backward
        share (a frozen tower's stage is all forward)."""
        share = self.ops[p.op].backward_share
        return p.seconds * (1 - share), p.seconds * share, extra * (1 - share), extra * share

    def loss_load(
        self,
        waves: Sequence[Sequence[PieceTime]],
        k: int,
        groups: Mapping[str, tuple[int, ...]] | None = None,
        moves: Mapping[int, float] | None = None,
    ) -> dict[int, float]:
        """Seconds of the loss phase (one pass) per device: each sink's loss heads on the
        devices of its last piece in ``waves`` (an lm sink in ``groups``: on its group's), as
        the runtime computes them after the last forward wave, plus ``moves`` (the spread
        sinks' rows moving to their groups and their gradients back). The planner reads it
        to spread the phase (``planner.evaluate.relabel``)."""
        last: dict[str, PieceTime] = {}
        for wave in waves:
            for p in wave:
                last[p.op] = p
        load: dict[int, float] = dict(moves or {})
        groups = groups or {}
        for s in self.sinks:
            p = last.get(s.sink)
            if p is None:
                continue
            batch = self.ops[s.sink].batch
            group = groups.get(s.sink) if s.loss == "lm" else None
            if group:  # each device of the group on its part of the positions' ceil split
                for d, held in zip(group, spread_shares(s, batch, k, len(group)), strict=True):
                    if held:
                        load[d] = load.get(d, 0.0) + self.loss_seconds(s, held)
                continue
            shard = _shard(batch, k, len(p.devices))
            each = self.loss_seconds(s, shard)  # every device of the piece alike
            if s.loss == "contrastive":  # readouts everywhere, InfoNCE of the batch on one
                for d in p.devices:
                    load[d] = load.get(d, 0.0) + each / 2
                d0 = p.devices[0]
                load[d0] = load.get(d0, 0.0) + self.loss_seconds(s, _shard(batch, k, 1)) / 2
                continue
            for d in p.devices:
                load[d] = load.get(d, 0.0) + each
        return load

    def _holders(
        self,
        waves: Sequence[Sequence[PieceTime]],
        loss_groups: Mapping[str, tuple[int, ...]] | None = None,
    ) -> dict[str, Held]:
        """Every trainable part the waves run, as the runtime assigns parts: a layer to its
        entries' devices, input stages to the first entry's, an LM head to the sink's last
        entry's and to its loss group's, if spread (in the order the forward pass first
        meets them)."""
        held: dict[str, Held] = {}
        # the layers of a shared module meet the same pieces in the same order: each union of
        # two holder sets is made once (frozensets keep their hash; a hit compares identity)
        unions: dict[tuple[frozenset[int], frozenset[int]], frozenset[int]] = {}

        def add(
            key: str, nbytes: float, group: frozenset[int], wave: int, lag: float = float("inf")
        ) -> None:
            if nbytes <= 0:
                return
            h = held.get(key)
            if h is None:
                held[key] = Held(nbytes, group, wave, len(held), lag)
                return
            if wave == h.wave:  # another piece of its earliest wave: the later one counts
                h.lag_s = max(h.lag_s, lag)
            if group is not h.devices:
                pair = (h.devices, group)
                both = unions.get(pair)
                if both is None:
                    both = unions[pair] = h.devices | group
                h.devices = both

        last_piece: dict[str, tuple[int, PieceTime, frozenset[int]]] = {}
        for wi, wave in enumerate(waves):
            for p in wave:
                op = self.ops[p.op]
                # one set per piece, shared by every part it runs (at thousands of devices a
                # piece's layers would otherwise copy its device list once each)
                group = frozenset(p.devices)
                # one layer's backward: the piece finishes layer g (end - g) of them in, and
                # its input stages after its first layer
                each = p.seconds / max(p.end - p.first, 1) * op.backward_share
                if p.first == 0:
                    for stage in op.inputs:
                        add(stage.part, stage.grad_bytes, group, wi, (p.end - p.first) * each)
                for g in range(p.first, p.end):
                    key, nbytes = op.layer_parts[g]
                    add(key, nbytes, group, wi, (p.end - g) * each)
                last_piece[p.op] = (wi, p, group)
        spread = loss_groups or {}
        for s in self.sinks:
            got = last_piece.get(s.sink)
            if got is None:
                continue
            group = got[2]
            if s.loss == "lm" and spread.get(s.sink):
                group = group | frozenset(spread[s.sink])
            if s.head_part:  # final after the loss phase, before any wave's backward
                add(s.head_part, s.head_bytes, group, len(waves), 0.0)
            if s.tied_part:  # the runtime holds it with the head too
                add(s.tied_part, s.tied_bytes, group, got[0])
        return held

    def _buckets(self, held: Mapping[str, Held]) -> list[tuple[tuple[int, ...], float, int, float]]:
        """(holders, bytes, wave the bucket is ready in, how far into that wave's backward)
        of every bucket, as the runtime cuts them (``backends/torch/shards.plan_buckets``):
        parts with the same holders, in the order their backward ends (later waves first,
        later layers first inside one), cut where a bucket would pass ``bucket_bytes``, and
        where the backward moves on to an earlier wave once the bucket holds
        ``min_bucket_bytes`` (each bucket one collective, each paying its latency; where a
        node's devices share its cores, only at the cap: ``shards.least_bucket_elements``). The
        runtime issues a bucket from the accumulation hook of its last gradient, so inside
        the wave's backward (``backends/torch/grads.py``)."""
        groups: dict[tuple[int, ...], list[Held]] = {}
        ranks_of: dict[frozenset[int], tuple[int, ...]] = {}  # parts share their sets
        for h in held.values():
            if len(h.devices) > 1:
                ranks = ranks_of.get(h.devices)
                if ranks is None:
                    ranks = ranks_of[h.devices] = tuple(sorted(h.devices))
                groups.setdefault(ranks, []).append(h)
        out = []
        cap = self.overheads.bucket_bytes
        least = self.overheads.min_bucket_bytes if self.core_each else cap
        for ranks, parts in groups.items():
            parts.sort(key=lambda h: (-h.wave, -h.order))
            size, ready, lag = 0.0, 0, 0.0
            for h in parts:
                moved = h.wave != ready and size >= least
                if size and (size + h.nbytes > cap or moved):
                    out.append((ranks, size, ready, lag))
                    size = 0.0
                lag = h.lag_s if not size or h.wave != ready else max(lag, h.lag_s)
                size += h.nbytes
                ready = h.wave  # waves only fall along the order
            out.append((ranks, size, ready, lag))
        return out

    def _reduction(
        self, held: Mapping[str, Held], phases: Sequence[float], k: int, zero_stage: int
    ) -> float:
        """The exposed gradient reduction, ``phases`` being each wave's backward (one pass)."""
        if self.grad_in_curves:
            return 0.0  # the planner adds the shared modules' extra itself
        buckets = self._buckets(held)
        backward = backward_clock(phases)
        worst = 0.0
        for d in sorted({d for ranks, *_ in buckets for d in ranks}):
            overlapped: list[tuple[float, float]] = []  # (ready time, seconds)
            after = 0.0
            for ranks, nbytes, wave, lag in buckets:
                if d not in ranks:
                    continue
                first_s, last_s = self._collectives(nbytes, len(ranks), zero_stage)
                if zero_stage == 2:
                    first_s *= k  # a reduce-scatter into the gradient shard every pass
                after += last_s
                if self.overlaps_reduction:
                    at = min(backward.start_s(wave) + lag, backward.ready_s(wave))
                    overlapped.append((at, first_s))
                else:
                    after += first_s
            clock = 0.0
            for at, secs in sorted(overlapped):
                clock = max(clock, at) + secs
            worst = max(worst, max(0.0, clock - backward.total_s) + after)
        return worst

    def _collectives(self, nbytes: float, group: int, zero_stage: int) -> tuple[float, float]:
        """(summing the gradients, gathering the weights after the update) for one bucket."""
        o = self.overheads
        if zero_stage == 0:
            return o.all_reduce.seconds(nbytes, group), 0.0
        gather = o.all_gather.seconds(nbytes, group)
        if o.grad_collective == "all_reduce":
            return o.all_reduce.seconds(nbytes, group), gather
        return o.reduce_scatter.seconds(nbytes, group), gather

    def _optimizer(self, held: Mapping[str, Held], zero_stage: int) -> float:
        o = self.overheads
        owned = np.zeros(self.devices)
        per_part = np.zeros(self.devices)
        holds = np.zeros(self.devices, dtype=bool)
        ids: dict[int, np.ndarray] = {}  # parts share their holder sets (``_holders``)
        for key, h in held.items():
            share = h.nbytes / len(h.devices) if zero_stage >= 1 else h.nbytes
            idx = ids.get(id(h.devices))
            if idx is None:
                idx = ids[id(h.devices)] = np.fromiter(h.devices, np.int64, len(h.devices))
            owned[idx] += share  # a set: no device twice
            if zero_stage == 0:
                # replicated: AdamW over the part's own tensors on every holder, which with
                # other holders first lays its gradients into the all-reduced flat buffer
                alone = len(h.devices) == 1
                per_part[idx] += (o.part_alone_seconds if alone else o.part_replicated_seconds)(
                    key, h.nbytes
                )
            else:
                # an only holder steps the part in place; several share it through flat buffers
                alone = len(h.devices) == 1
                per_part[idx] += (o.part_alone_seconds if alone else o.part_seconds)(key, h.nbytes)
            holds[idx] = True
        (ranks,) = np.nonzero(holds)
        line, mine = o.optimizer, owned[ranks]
        work = np.where(mine > 0, line.alpha_s + line.beta_s * mine, 0.0) + per_part[ranks]
        return self._share(dict(zip(ranks.tolist(), work.tolist(), strict=True)))


def _moves_exposed(
    wave: Sequence[PieceTime], extras: Sequence[float], move: WaveMoves | None, longest: float
) -> float:
    """What a wave's moves add where its groups run on cores of their own: a move delays the
    ranks it joins, not the rest of the wave (module docstring), so it shows only where a
    piece's stage with its busiest device's moves, or a sender's moves alone, outlast the
    wave's longest stage; never more than all the moves run after the wave."""
    if move is None or move.busiest_s <= 0:
        return 0.0
    with_moves = move.device_s
    for p, extra, moved in zip(wave, extras, move.per_piece, strict=True):
        if p.devices:
            with_moves = max(with_moves, p.seconds + extra + moved)
    return min(max(with_moves - longest, 0.0), move.busiest_s)


def _disjoint(wave: Sequence[PieceTime]) -> bool:
    """Whether no device runs two pieces of ``wave``."""
    count = sum(len(p.devices) for p in wave)
    return count == len(set().union(*(p.devices for p in wave))) if count else True


def ceil_split(rows: int, n: int) -> list[int]:
    """The rows each of ``n`` devices holds when ``rows`` are split into contiguous shards of
    ``ceil(rows / n)`` (the runtime's split: the last shards may be short or empty)."""
    size = comm.ceil_div(rows, n) if n else 0
    return [max(0, min(size, rows - i * size)) for i in range(n)]


def spread_shares(sink: SinkLoss, batch: int, k: int, n: int) -> list[float]:
    """The samples' worth each of ``n`` loss devices scores of a spread lm sink's pass: its
    ``ceil(batch / k)`` rows' positions split ceil-wise position by position, as the runtime
    splits them (``Plan.loss_devices``), in rows (positions over positions per row)."""
    per_row = max(sink.positions, 1)
    return [x / per_row for x in ceil_split(comm.ceil_div(batch, k) * per_row, n)]


def spread_share(sink: SinkLoss, batch: int, k: int, n: int) -> float:
    """The largest share of a pass's batch one of ``n`` loss devices scores of a spread lm
    sink (``spread_shares`` over the pass's rows): what its loss tensors scale by."""
    rows = comm.ceil_div(batch, k)
    return max(spread_shares(sink, batch, k, n), default=0.0) / rows if rows else 0.0


def _shard(batch: int, k: int, n: int) -> int:
    """Samples the largest device shard of one micro-batch pass holds."""
    return comm.ceil_div(comm.ceil_div(batch, k), max(n, 1)) if batch > 0 else 0


def make_step_model(
    graph: MetaGraph, overheads: StepOverheads, *, grad_in_curves: bool
) -> StepModel:
    """The step model of ``graph``: the cores a node's devices run on (``node_cores``), shared
    where there are fewer of them than devices and spare where there are more, and the
    graph's parts."""
    cluster = graph.cluster
    node = node_cores(cluster, overheads)
    per_node = cluster.devices_per_node
    return StepModel(
        overheads,
        node if node is not None and node < per_node else None,
        per_node,
        cluster.devices,
        grad_in_curves,
        op_steps(graph),
        sink_losses(graph),
        spare_core=node is None or node > per_node,
    )


def node_cores(cluster: Cluster, overheads: StepOverheads) -> int | None:
    """The CPU cores one node's devices run on: the cluster's own count, else the profiled
    machine's, else the planning machine's; None for GPUs (each computes on its own, and
    collectives run beside the kernels)."""
    if cluster.device.name.lower() != "cpu":
        return None
    if cluster.cores is not None:
        return cluster.cores
    return overheads.cores if overheads.cores is not None else usable_cores()
