"""What a placed candidate gets before it is ranked: device renamings at wave boundaries,
weighing activation moves and the loss phase together on the priced step
(``rename_devices``), then its lm losses spread over more devices (``spread_losses``,
``relabel_and_spread``, ``spread_round``).

Renaming devices by one permutation in every wave from a cut on (or in every wave before it)
keeps every wave a valid wave (the same pieces, on groups of the same sizes, still disjoint)
and changes only what crosses the cut: its activation moves, the parameter holders of modules
run on both sides, each device's memory, and which devices end which sinks. Two kinds of
renaming are proposed:

- **inputs** (``matching_label``): placement goes wave by wave and no later wave can take back
  an earlier one's choice, so a piece that lost its preferred devices reads its rows from
  elsewhere, often across nodes. For a cut whose wave shows moves the compute does not hide
  (at least ``MIN_SHOWN`` of the step, ``cuts_with_moves``), the pieces just after it are
  named after their sources' devices (the MetaOp's previous piece, else the producer moving
  the most bytes), pair by pair in shard order, heaviest first; with ``prefix`` the sources
  are named after the pieces instead. Every other device keeps its id where that is free,
  else takes a free id in its own node first.
- **losses** (``candidates``): the runtime computes every sink's loss heads after the last
  forward wave on the devices of the sink's last piece (``cost.step``), so a device that
  ends two sinks computes both while the others wait (several percent of a step with
  vocabulary-sized heads: qwen_val at 16 devices). For each way of splitting the sinks by
  where their last piece lies, the losses that move are paired with those that stay, the
  busiest device exchanging with the one that lowers the pair's larger load the most
  (``spread``, which reaches the bottleneck pairing's peak, ``best_peak``). Only pairings
  whose loss phase could be at least ``MIN_GAIN`` of the step shorter are priced.

Why one search. The two kinds pull against each other: pairing the losses renames whole
groups across nodes and puts pieces off their inputs; matching the inputs can pile the losses
back. So the search descends through them in turn (a variable-neighbourhood descent): the
inputs' renamings round after round, each round keeping its quickest proposal, until none
gains; then one round of the losses' pairings; after any gain the inputs' again; it ends when
neither gains, or after ``MAX_TRIALS`` pricings (``LATE_TRIALS`` in all where one more would
end past the planning call's deadline and a proposal is slow: ``_Trials``). Every proposal is
priced with the same step model as any plan (timed first, its memory ledgered only when
quicker) and kept only where it fits no worse. On ``bench/specs/ofasys_7task`` at 16 devices
this descent ends on a quicker step than the pairings alone, the matchings run to the end
before them, or each round's quickest of both kinds.

Spread LM losses over every device that holds their head, so that no device's loss phase
waits for a heavy sink's rows.

Why. The runtime computes an lm sink's loss (vocabulary head and cross-entropy, forward and
backward) after the last forward wave on the devices of the sink's last piece (``cost.step``,
``loss_s``), and the loss phase lasts as long as its busiest device. The sink's group was sized
for its layers, not for its loss: a task with long text has few rows per layer-second but many
tokens to score, so its devices score well above the mean while the other sinks' devices wait
(qwen_val's text task at 128 devices is such a sink). Relabeling devices
(``planner.evaluate.relabel``) cannot help when the sinks already end on disjoint groups that
cover the cluster.

What. The devices that end any sink of one LM head all hold that head (and a tied embedding
stage), so any of them can score any of those sinks' rows: a sink's head inputs (its output at
the positions the head reads) are re-split over the union of those devices, each scores its
share, and the gradients of those inputs go back (the runtime's flows, as between entries;
``Plan.loss_devices``). Nothing else changes: the same devices hold the head, so the gradient
reduction and the optimizer are the same, and the sum of the shares is the same loss.

How it is chosen. Per head, its sinks are spread heaviest first (loss seconds per device on
their own group): the heaviest alone, the two heaviest, ..., all. A spread sink's group is
chosen greedily on the loss seconds the devices already carry (``balanced_groups``): for each
group size g from its own group's to the union's, its g least loaded devices of the union (the
runtime splits the positions ceil-wise, so the last device gets the short share: the most
loaded of them); the g whose busiest device ends least loaded wins. The group's order is then
its shard order (``shard_order``): each device scores positions its own rows hold or a device
of its node holds, so that the rows move as little and as locally as the group allows: the
busiest device moves less than with the same groups in the order of their loads.
The runtime moves positions, not rows, so a long-text row may be scored on two devices and a
pass with fewer rows than devices still spreads over all of them. The candidates are judged
by their loss phase alone (moves included), and the ``PRICED`` best whose phase is shorter
are priced by the same step model as any plan (the moves with the cost model's transfers,
the memory with the loss tensors moved, ``relabel.placed``) and kept only if the whole
step is quicker and fits no worse.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from spindle_dsl.cost.comm import ceil_div
from spindle_dsl.cost.step import PieceTime, StepModel, spread_share, spread_shares
from spindle_dsl.cost.step_parts import SinkLoss
from spindle_dsl.planner.evaluate.build import (
    Evaluated,
    PlanContext,
    ms_change,
    time_of,
    transfer_of,
)
from spindle_dsl.planner.evaluate.placement import NodePool, PlacedPiece, Placement
from spindle_dsl.planner.evaluate.timing import loss_moves
from spindle_dsl.planner.model.problem import Piece

MAX_TRIALS = 48  # step pricings per plan, at most
# ... and where one more would end past the planning call's deadline and a proposal takes
# ``SLOW_PRICING_S`` or more, none past this many (what a renaming search makes whatever the
# clock says): at 1,024 devices x 48 tasks a proposal costs 50-500 ms (its pricing, and its
# memory ledger where it is quicker) and the first gain the most; at 64 devices 5-10 ms
LATE_TRIALS = 8
SLOW_PRICING_S = 0.05
RENAME_NOTE = "devices renamed at wave boundaries"  # how a renamed plan's note begins

Kind = Literal["inputs", "losses"]  # the two kinds of renaming (module docstring)


def proposals(ctx: PlanContext, ev: Evaluated, kind: Kind) -> Iterator[tuple[int, bool, list[int]]]:
    """(cut, prefix, label) of each renaming of ``kind`` worth pricing for ``ev``: for
    ``"inputs"``, the matchings at each boundary whose moves show
    (``cuts_with_moves``), after it and before it; for ``"losses"``, the pairings
    whose loss phase could be ``MIN_GAIN`` of the step shorter, both ways of
    breaking ties (each costs differently elsewhere)."""
    waves = ev.placement.waves
    k = ctx.levers.micro_batches
    step = ctx.step
    if kind == "inputs":
        for cut in cuts_with_moves(ev, k):
            for prefix in (False, True):
                label = matching_label(ctx, waves, cut, prefix)
                if label is not None:
                    yield cut, prefix, label
    elif kind == "losses" and step is not None and step.sinks:
        n = ctx.topology.devices
        worth = worth_spreading(sink_loads(step, waves, k, n), ev.iteration_s, k)
        for peak, cut, prefix, a, b in candidates(step, waves, k, n):
            if peak > worth:
                break
            for tie in ("low", "high"):
                label = spread(a, b, tie)
                if label is not None:
                    yield cut, prefix, label


@dataclass
class _Trials:
    """The pricings one renaming search may still make: ``MAX_TRIALS`` in all, and none past
    ``LATE_TRIALS`` in all once one more would end past ``deadline`` (``time.perf_counter``)
    where its slowest proposal took ``SLOW_PRICING_S`` or more; quicker ones run whatever the
    clock says."""

    deadline: float
    used: int = 0
    slowest: float = 0.0

    def take(self) -> bool:
        """Whether one more proposal may be priced (and count it): late where it would end
        past the deadline at the pace of the slowest so far."""
        late = (
            self.slowest >= SLOW_PRICING_S and time.perf_counter() + self.slowest >= self.deadline
        )
        if self.used >= (LATE_TRIALS if late else MAX_TRIALS):
            return False
        self.used += 1
        return True

    def took(self, seconds: float) -> None:
        """Record one proposal's time: its pricing and, where it is quicker, its ledger."""
        self.slowest = max(self.slowest, seconds)


def _best_of(ctx: PlanContext, start: Evaluated, kind: Kind, trials: _Trials) -> Evaluated:
    """The quickest renaming of ``kind`` of ``start`` that fits no worse (``start`` itself if
    none is quicker), pricing proposals while ``trials`` allows."""
    cap = ctx.topology.capacity
    best = start
    for cut, prefix, label in proposals(ctx, start, kind):
        if not trials.take():
            break
        began = time.perf_counter()
        try:
            renamed = relabeled(start.placement.waves, label, cut, prefix)
            # timed first (the step model reads the waves alone), the memory ledger only for
            # a renaming that is quicker: at 256 devices the ledger costs more than the timing
            timing = time_of(ctx, Placement(renamed, (), ()))
            if timing.iteration_s >= best.iteration_s * (1 - 1e-9):
                continue
            pl = placed(ctx, renamed)
            if overflow_bytes(pl.memory, cap) > overflow_bytes(start.placement.memory, cap):
                continue  # a plan that fits keeps fitting
            best = Evaluated(start.schedule, pl, timing)
        finally:
            trials.took(time.perf_counter() - began)
    return best


def rename_devices(
    ctx: PlanContext,
    ev: Evaluated,
    *,
    losses: bool = True,
    inputs: bool = True,
    deadline: float = math.inf,
) -> Evaluated:
    """``ev`` with devices renamed at wave boundaries where the whole step gets quicker and
    fits no worse (module docstring), or ``ev`` itself; ``losses`` / ``inputs`` False leave
    that kind of renaming out (to measure what each buys); ``deadline``: when the planning
    call's budget ends (``_Trials``). A plan whose losses are already spread over groups
    (``Placement.loss_groups``) is left as it is: a renaming would have to carry its groups
    along."""
    if len(ev.placement.waves) < 2 or ev.placement.loss_groups:
        return ev
    kinds: list[Kind] = [kind for kind, on in (("inputs", inputs), ("losses", losses)) if on]
    best, trials, i = ev, _Trials(deadline), 0
    while i < len(kinds) and trials.used < MAX_TRIALS:
        got = _best_of(ctx, best, kinds[i], trials)
        if got is best:
            i += 1  # nothing of this kind gains: the next kind
        else:
            best, i = got, 0  # a gain: the inputs' renamings again first
    if best is ev:
        return ev
    was, now = ev.timing, best.timing
    terms = [
        f"{name} {ms_change(a, b)}"
        for name, a, b in (
            ("transfers", was.transfer_s, now.transfer_s),
            ("losses", was.loss_s, now.loss_s),
        )
        if abs(a - b) >= 5e-5  # what the note's 0.1 ms shows
    ]
    return best.with_gain_note(ev, f"{RENAME_NOTE}: {', '.join(terms)}" if terms else RENAME_NOTE)


MIN_SHOWN = 0.0005  # skip a boundary whose moves show less than this share of the step


def source_piece(
    ctx: PlanContext, last: Mapping[str, PlacedPiece], p: PlacedPiece
) -> PlacedPiece | None:
    """Where ``p`` reads its rows from, ``last`` being each MetaOp's latest piece before
    ``p``'s wave: its MetaOp's previous piece, else the last piece of its producer moving the
    most bytes; None for a piece with neither (a MetaOp that starts from the raw batch)."""
    if p.op in last:
        return last[p.op]
    deps = [d for d in ctx.problem.op(p.op).deps if d in last]
    if not deps:
        return None
    return last[max(deps, key=lambda d: ctx.topology.weight.get(d, 0.0))]


def matching_label(ctx: PlanContext, waves: Waves, cut: int, prefix: bool) -> list[int] | None:
    """The renaming ``label`` (device ``x`` becomes ``label[x]``) of the waves from ``cut`` on
    (``prefix``: of those before it) that puts the pieces of wave ``cut`` on their sources'
    devices (module docstring); None where it would rename nothing."""
    devices, per_node = ctx.topology.devices, ctx.topology.per_node
    label = [-1] * devices
    taken = [False] * devices
    weight = ctx.topology.weight
    last: dict[str, PlacedPiece] = {}
    for wave in waves[:cut]:
        for q in wave:
            last[q.op] = q
    for p in sorted(waves[cut], key=lambda p: -weight.get(p.op, 0.0)):
        src = source_piece(ctx, last, p)
        if src is None:
            continue
        # pair by pair in shard order; a group larger than the other keeps its extra devices
        pairs = (src.devices, p.devices) if prefix else (p.devices, src.devices)
        for x, y in zip(*pairs, strict=False):
            if label[x] < 0 and not taken[y]:
                label[x], taken[y] = y, True
    if all(y < 0 or y == x for x, y in enumerate(label)):
        return None
    rest = [x for x in range(devices) if label[x] < 0]
    for x in rest:  # keep its id where nobody took it
        if not taken[x]:
            label[x], taken[x] = x, True
    free = NodePool((y for y in range(devices) if not taken[y]), per_node)
    for x in rest:
        if label[x] < 0:  # a free id in its own node first
            label[x] = free.take(x // per_node)
    return label


def cuts_with_moves(ev: Evaluated, micro_batches: int) -> list[int]:
    """The boundaries worth renaming at: those whose wave shows moves worth at least
    ``MIN_SHOWN`` of the step (``Timing.wave_transfer``, one pass's; the most first), or,
    without a step model's split, every boundary."""
    shown = ev.timing.wave_transfer
    n = len(ev.placement.waves)
    if not shown:
        return list(range(1, n))
    least = MIN_SHOWN * ev.iteration_s / max(1, micro_batches)
    return sorted((c for c in range(1, n) if shown[c] >= least), key=lambda c: -shown[c])


MIN_GAIN = 0.002  # skip a plan whose loss phase could gain less than this share of its step

Waves = tuple[tuple[PlacedPiece, ...], ...]


def loss_loads(step: StepModel, waves: Waves, micro_batches: int) -> dict[int, float]:
    """One pass's loss seconds per device for these placed waves."""
    return step.loss_load(
        [[PieceTime(p.op, p.first, p.end, p.devices, 0.0) for p in w] for w in waves],
        micro_batches,
    )


def relabeled(waves: Waves, label: Sequence[int], cut: int, prefix: bool = True) -> Waves:
    """``waves`` with device ``x`` renamed ``label[x]`` in every wave before ``cut`` (with
    ``prefix``; else in every wave from ``cut`` on), ``label`` a permutation of the ids. A
    piece keeps its devices' order (the shard order placement chose: the k-th device takes
    the k-th rows), each device renamed in its place."""

    def move(p: PlacedPiece) -> PlacedPiece:
        ids = tuple(label[x] for x in p.devices)
        return p if ids == p.devices else PlacedPiece(p.op, p.first, p.end, ids)

    return tuple(tuple(map(move, w)) if (i < cut) == prefix else w for i, w in enumerate(waves))


def sink_loads(
    step: StepModel, waves: Waves, micro_batches: int, devices: int
) -> list[tuple[int, np.ndarray]]:
    """Per sink that runs: the wave of its last piece and its loss seconds per device."""
    last: dict[str, tuple[int, PlacedPiece]] = {}
    for i, w in enumerate(waves):
        for p in w:
            last[p.op] = (i, p)
    out = []
    for sink in dict.fromkeys(s.sink for s in step.sinks):
        if sink in last:
            i, p = last[sink]
            vec = np.zeros(devices)
            for x, v in loss_loads(step, ((p,),), micro_batches).items():
                vec[x] = v
            out.append((i, vec))
    return out


def spread(a: np.ndarray, b: np.ndarray, tie: str = "low") -> list[int] | None:
    """A relabeling ``label`` (device ``x`` becomes ``label[x]``) of the waves whose losses
    are ``a`` per device, the others' ``b`` staying, that lowers the peak of
    ``a[x] + b[label[x]]``, or None. Greedily, the most loaded device exchanges with the
    device that lowers the larger of the pair's new loads the most, while that is below the
    current peak (each exchange lowers the peak or the number of devices at it): few devices
    move, and pairing large ``a`` with small ``b`` is what evens the sums. Among exchanges as
    good, ``tie`` takes the lowest id ("low") or the highest ("high"): what they cost
    elsewhere (transfers, the gradient reduction's groups) differs, and the caller prices
    each."""
    n = len(a)
    src = np.arange(n)  # src[y]: the device whose relabeled waves now run on y
    load = a + b
    moved = False
    for _ in range(n):
        y = int(np.argmax(load))
        peak = load[y]
        pair = np.maximum(a[src] + b[y], a[src[y]] + b)  # if y exchanged with z
        pair[y] = np.inf
        least = pair.min()
        if not least < peak * (1 - 1e-9):
            break
        ties = np.flatnonzero(pair <= least * (1 + 1e-12))
        z = int(ties[-1] if tie == "high" else ties[0])
        src[y], src[z] = src[z], src[y]
        load[y], load[z] = a[src[y]] + b[y], a[src[z]] + b[z]
        moved = True
    if not moved:
        return None
    label = [0] * n
    for y, x in enumerate(src.tolist()):
        label[x] = y
    return label


def best_peak(a: np.ndarray, b: np.ndarray) -> float:
    """The least peak of ``a[x] + b[label[x]]`` over all relabelings: the largest ``a``
    with the smallest ``b`` (the bottleneck pairing)."""
    return float((np.sort(a)[::-1] + np.sort(b)).max())


def candidates(
    step: StepModel, waves: Waves, micro_batches: int, devices: int
) -> list[tuple[float, int, bool, np.ndarray, np.ndarray]]:
    """(least loss peak, cut, prefix, a, b) for each way to split the sinks at a wave
    boundary: those whose last piece comes before the cut move with a relabeling of the
    waves before it (``prefix``, the cut right after the last of them: the fewest waves
    relabeled) or with one of the waves from the cut on (the cut at the first of the others),
    best first."""
    sinks = sink_loads(step, waves, micro_batches, devices)
    ends = sorted({i for i, _ in sinks})
    out = []
    for lo, hi in itertools.pairwise(ends):
        early = sum((v for i, v in sinks if i <= lo), np.zeros(devices))
        late = sum((v for i, v in sinks if i >= hi), np.zeros(devices))
        peak = best_peak(early, late)
        out.append((peak, lo + 1, True, early, late))
        out.append((peak, hi, False, late, early))
    out.sort(key=lambda c: (c[0], c[1], not c[2]))
    return out


def placed(
    ctx: PlanContext, waves: Waves, loss_groups: tuple[tuple[str, tuple[int, ...]], ...] = ()
) -> Placement:
    """The placement of ``waves`` as they are, its memory priced by a fresh ledger in the
    order placement adds pieces (a wave's largest groups first), with the lm losses of
    ``loss_groups`` moved to their groups (``planner.evaluate.relabel``)."""
    ledger = ctx.ledger()
    last_op: dict[int, str] = {}
    last: dict[str, PlacedPiece] = {}
    for wave in waves:
        for p in sorted(wave, key=lambda p: -p.n):
            piece = Piece(p.op, p.first, p.end, p.n)
            ledger.add(piece, p.devices, ledger.need(piece))
            last[p.op] = p
            for x in p.devices:
                last_op[x] = p.op
    if loss_groups:
        assert ctx.step is not None
        sinks = {s.sink: s for s in ctx.step.sinks}
        k = ctx.levers.micro_batches
    for sink, group in loss_groups:
        p = last[sink]
        share = spread_share(sinks[sink], ctx.step.ops[sink].batch, k, len(group))
        ledger.spread_loss(sink, p.end, p.devices, group, share)  # type: ignore[attr-defined]
    memory = ledger.memory()
    cap = ctx.topology.capacity
    overflow = tuple((x, last_op.get(x, ""), b) for x, b in enumerate(memory) if b > cap)
    fullest = ledger.breakdown(max(range(len(memory)), key=memory.__getitem__)) if memory else None
    return Placement(waves, memory, overflow, fullest, loss_groups)


def worth_spreading(sinks: list[tuple[int, np.ndarray]], iteration_s: float, k: int) -> float:
    """The loss peak a pairing must reach to be priced (``sink_loads``' per-sink loads): the
    present peak less ``MIN_GAIN`` of one pass of the step."""
    if not sinks:
        return -np.inf
    now = float(sum(v for _, v in sinks).max())
    return now - MIN_GAIN * iteration_s / max(1, k)


def overflow_bytes(memory: Sequence[int], cap: int) -> int:
    """Bytes over ``cap``, summed over the devices: a relabeling keeps a plan that fits
    fitting, and one that overflows no worse."""
    return sum(max(0, m - cap) for m in memory)


SPREAD_LOSS_NOTE = "lm losses spread over their head's devices"  # how the plan's note begins

Groups = dict[str, tuple[int, ...]]


def head_sinks(step: StepModel, last: dict[str, PlacedPiece]) -> dict[str, list[SinkLoss]]:
    """Per LM head part, the lm sinks that run and read it (whose rows could move)."""
    out: dict[str, list[SinkLoss]] = {}
    for s in step.sinks:
        if s.loss == "lm" and s.head_part and s.hidden_bytes > 0 and s.sink in last:
            out.setdefault(s.head_part, []).append(s)
    return out


def balanced_groups(
    step: StepModel,
    spread: list[SinkLoss],
    union: tuple[int, ...],
    load: dict[int, float],
    sources: Mapping[str, tuple[int, ...]],
    k: int,
    per_node: int,
) -> Groups:
    """A loss group per sink of ``spread`` (heaviest first), chosen greedily on ``load``, the
    loss seconds each device carries from the sinks that stay (module docstring); ``sources``:
    the devices of each sink's last piece, in shard order, and ``per_node`` the devices of a
    node, which order each group (``shard_order``). ``load`` is updated with what the groups
    add.

    A group of g devices, the least loaded first, takes ``ceil(P / g)`` of the pass's P
    positions on each but the last; since the loads are sorted, its busiest device is the
    (g-1)-th with a full share or the g-th with the rest, so each g is weighed in constant
    time; every g up to ``EVERY_SIZE`` is tried, then sizes about ``SIZE_STEP`` apart. The
    least busiest device of the union wins, then the least busy group."""
    out: Groups = {}
    for s in spread:
        per_row = max(s.positions, 1)
        total = ceil_div(step.ops[s.sink].batch, k) * per_row
        if total <= 0:
            continue
        order = sorted(union, key=lambda d: (load.get(d, 0.0), d))
        loads = [load.get(d, 0.0) for d in order]
        best: tuple[tuple[float, float], int, bool] | None = None  # (key, g, short last share)
        for g in _sizes(min(len(sources[s.sink]), len(order)), min(len(order), total)):
            c = ceil_div(total, g)
            g = ceil_div(total, c)  # the devices a ceil split of c positions each uses
            rest = total - (g - 1) * c
            peak = loads[g - 1] + step.loss_seconds(s, rest / per_row)
            if g >= 2:
                peak = max(peak, loads[g - 2] + step.loss_seconds(s, c / per_row))
            outside = loads[-1] if g < len(loads) else peak
            key = (max(peak, outside), peak)
            if best is None or key < best[0]:
                best = (key, g, rest < c)
        assert best is not None
        _, g, short = best
        group = shard_order(sources[s.sink], order[:g], per_node, keep_last=short)
        shares = spread_shares(s, step.ops[s.sink].batch, k, len(group))
        for d, held in zip(group, shares, strict=True):
            if held:
                load[d] = load.get(d, 0.0) + step.loss_seconds(s, held)
        out[s.sink] = group
    return out


def shard_order(
    source: tuple[int, ...], chosen: Sequence[int], per_node: int, keep_last: bool
) -> tuple[int, ...]:
    """``chosen`` ordered so that the positions each device scores are, as far as it can,
    positions its own shard holds or a device of the same node holds, since the runtime splits
    the sink's rows over ``source`` and its positions over the group in their orders.

    Why. The order is free (every device of the group scores an equal share, but the last),
    and what the spread moves depends on it alone: in the order of their loads the devices'
    slots fall anywhere, so most rows leave their device and many their node, where a link is
    ~12x slower than inside one (A100: 25 against 300 GB/s).

    How. Slot j of g takes the source whose shard holds its middle position; a source device
    in the group takes the middle one of the slots its own shard holds, every other slot a
    free device of its source's node, else the first free one. With ``keep_last`` (the last
    slot scores a short share) the last of ``chosen``, the most loaded, stays last, as the
    group's size was chosen for. Linear in the devices of both."""
    g, n = len(chosen), len(source)
    slots = [-1] * g
    free = list(chosen)
    if keep_last:
        slots[-1] = free.pop()
    home = [min(n - 1, (2 * j + 1) * n // (2 * g)) for j in range(g)]
    held: dict[int, list[int]] = {}  # source index -> the open slots its shard holds
    for j in range(g):
        if slots[j] < 0:
            held.setdefault(home[j], []).append(j)
    left = set(free)
    for i, d in enumerate(source):
        mine = held.get(i)
        if d in left and mine:
            slots[mine[len(mine) // 2]] = d
            left.discard(d)
    pool = NodePool((d for d in free if d in left), per_node)
    for j in range(g):
        if slots[j] < 0:
            slots[j] = pool.take(source[home[j]] // per_node)
    return tuple(slots)


EVERY_SIZE = 64  # group sizes tried one by one up to this many devices
SIZE_STEP = 1.05  # then each about this much larger than the last
MAX_SPREADS = 8  # heaviest-first prefixes of a head's sinks tried, at most
PRICED = 2  # of those, the ones with the shortest loss phase whose whole step is priced


def _sizes(low: int, high: int) -> list[int]:
    """Group sizes from ``low`` to ``high``: each up to ``EVERY_SIZE``, then a geometric
    grid, ``high`` always included."""
    out, g = [], max(1, low)
    while g <= high:
        out.append(g)
        g = g + 1 if g < EVERY_SIZE else max(g + 1, int(g * SIZE_STEP))
    if not out or out[-1] != high:
        out.append(high)
    return out


def _prefixes(m: int) -> list[int]:
    """How many of a head's m sinks (heaviest first) each candidate spreads: every count up
    to 4, then doubling, m always; at most ``MAX_SPREADS`` (the largest kept)."""
    counts = sorted({*range(1, min(m, 4) + 1), *(2**i for i in range(2, 12) if 2**i < m), m})
    return counts[-MAX_SPREADS:] if len(counts) > MAX_SPREADS else counts


def spread_losses(ctx: PlanContext, ev: Evaluated) -> Evaluated:
    """``ev`` with the lm losses spread over their heads' devices where that makes the whole
    step quicker and fits no worse (module docstring), or ``ev`` itself."""
    step = ctx.step
    # (a ledger of whole pieces cannot move a sink's loss tensors: no spread without parts)
    if step is None or not ctx.per_part or ev.placement.loss_groups:
        return ev
    waves = ev.placement.waves
    last = {p.op: p for wave in waves for p in wave}
    k = ctx.levers.micro_batches
    cap = ctx.topology.capacity
    best = ev
    for sinks in head_sinks(step, last).values():
        union = tuple(sorted({d for s in sinks for d in last[s.sink].devices}))
        if all(len(last[s.sink].devices) == len(union) for s in sinks):
            continue  # every sink already scores on every device of the head
        alone = {s.sink: loss_loads(step, ((last[s.sink],),), k) for s in sinks}
        heavy = sorted(sinks, key=lambda s: -max(alone[s.sink].values(), default=0.0))
        base = dict(best.placement.loss_groups)
        sources = {s.sink: last[s.sink].devices for s in sinks}
        quick = []  # (the loss phase alone, with its moves; the groups)
        for j in _prefixes(len(heavy)):
            # the sinks that stay score on their own devices
            load = loss_loads(step, tuple((last[s.sink],) for s in heavy[j:]), k)
            trial_groups = {
                **base,
                **balanced_groups(step, heavy[:j], union, load, sources, k, ctx.topology.per_node),
            }
            quick.append((_loss_phase(ctx, waves, trial_groups), j, trial_groups))
        now = _loss_phase(ctx, waves, base)
        for phase, _, trial_groups in sorted(quick, key=lambda q: q[:2])[:PRICED]:
            if phase >= now * (1 - 1e-9):
                break  # the loss phase alone gets no shorter: the whole step cannot gain
            pl = placed(ctx, waves, tuple(trial_groups.items()))
            if overflow_bytes(pl.memory, cap) > overflow_bytes(best.placement.memory, cap):
                continue  # a plan that fits keeps fitting
            trial = Evaluated(best.schedule, pl, time_of(ctx, pl))
            if trial.iteration_s < best.iteration_s * (1 - 1e-9):
                best = trial
    if best is ev:
        return ev
    where = ", ".join(f"{sink} over {len(ds)}" for sink, ds in best.placement.loss_groups)
    losses = ms_change(ev.timing.loss_s, best.timing.loss_s)
    return best.with_gain_note(ev, f"{SPREAD_LOSS_NOTE} ({where}): losses {losses}")


def _loss_phase(ctx: PlanContext, waves: Waves, groups: Groups) -> float:
    """One pass's loss phase of ``waves`` with ``groups`` spread, moves included: what a
    candidate is judged by before the whole step is priced (``PRICED``)."""
    step = ctx.step
    assert step is not None
    pieces = [[PieceTime(p.op, p.first, p.end, p.devices, 0.0) for p in w] for w in waves]
    shell = Placement(waves, (), (), None, tuple(groups.items()))
    k = ctx.levers.micro_batches
    moves = loss_moves(shell, step, ctx.flows, transfer_of(ctx), k) if groups else None
    return max(step.loss_load(pieces, k, groups, moves).values(), default=0.0)


def relabel_and_spread(
    ctx: PlanContext, ev: Evaluated, inputs: bool = True, deadline: float = math.inf
) -> Evaluated:
    """A placed plan's devices renamed where that pays, pieces onto their inputs and large
    losses beside small ones (``rename_devices``; ``inputs`` False leaves the inputs'
    renamings out, to measure what they buy; ``deadline``: when the planning call's budget
    ends), then lm losses spread over their heads' devices (``spread_losses``), each kept
    where the whole step gets quicker."""
    return spread_losses(ctx, rename_devices(ctx, ev, inputs=inputs, deadline=deadline))


def spread_round(
    ctx: PlanContext,
    evaluated: Mapping[str, Evaluated],
    always: Collection[str],
    inputs: bool = True,
    deadline: float = math.inf,
) -> dict[str, Evaluated]:
    """``relabel_and_spread`` over one round's candidates, quickest first, skipping those that
    could not become the quickest fitting plan even with their loss spread evenly and no
    moves left (``_floor``: relabeling moves the same loss work between devices, so the
    busiest carries at least the mean), except the names in ``always`` (the requested
    scheduler and the baselines, whose reported times must be priced the same way as the
    plan's); ``deadline``: when the planning call's budget ends (``rename_devices``)."""
    out = dict(evaluated)
    best = float("inf")
    for name in sorted(evaluated, key=lambda n: evaluated[n].iteration_s):
        ev = evaluated[name]
        if name in always or _floor(ctx, ev, inputs) < best:
            out[name] = ev = relabel_and_spread(ctx, ev, inputs, deadline)
        if ev.fits:
            best = min(best, ev.iteration_s)
    return out


def _floor(ctx: PlanContext, ev: Evaluated, inputs: bool) -> float:
    """What ``ev`` could come down to at best: its loss phase spread evenly over the devices
    and, where the inputs' renamings run (``inputs``), no activation moves left."""
    step = ctx.step
    if step is None:
        return ev.iteration_s
    k = ctx.levers.micro_batches
    n = ctx.topology.devices
    total = sum(float(v.sum()) for _, v in sink_loads(step, ev.placement.waves, k, n))
    moves = ev.timing.transfer_s if inputs else 0.0
    return ev.iteration_s - ev.timing.loss_s + k * total / n - moves
