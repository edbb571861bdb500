"""Device renamings at wave boundaries, weighing activation moves and the loss phase together
on the priced step.

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
neither gains, or after ``MAX_TRIALS`` pricings. Every proposal is priced with the same step
model as any plan (timed first, its memory ledgered only when quicker) and kept only where it
fits no worse. On ``bench/specs/ofasys_7task`` at 16 devices this descent ends on a quicker
step than the pairings alone, the matchings run to the end before them, or each round's
quickest of both kinds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

import numpy as np

from spindle_dsl.cost.step import PieceTime, StepModel, spread_share
from spindle_dsl.planner.evaluate.build import Evaluated, PlanContext, ms_change, time_of
from spindle_dsl.planner.evaluate.placement import NodePool, PlacedPiece, Placement
from spindle_dsl.planner.model.problem import Piece

MAX_TRIALS = 48  # step pricings per plan, at most
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


def _best_of(ctx: PlanContext, start: Evaluated, kind: Kind, budget: int) -> tuple[Evaluated, int]:
    """The quickest renaming of ``kind`` of ``start`` that fits no worse (``start`` itself if
    none is quicker), pricing at most ``budget`` proposals; and how many it priced."""
    cap = ctx.topology.capacity
    best, used = start, 0
    for cut, prefix, label in proposals(ctx, start, kind):
        if used >= budget:
            break
        used += 1
        renamed = relabeled(start.placement.waves, label, cut, prefix)
        # timed first (the step model reads the waves alone), the memory ledger only for a
        # renaming that is quicker: at 256 devices the ledger costs more than the timing
        timing = time_of(ctx, Placement(renamed, (), ()))
        if timing.iteration_s >= best.iteration_s * (1 - 1e-9):
            continue
        pl = placed(ctx, renamed)
        if overflow_bytes(pl.memory, cap) > overflow_bytes(start.placement.memory, cap):
            continue  # a plan that fits keeps fitting
        best = Evaluated(start.schedule, pl, timing)
    return best, used


def rename_devices(
    ctx: PlanContext, ev: Evaluated, *, losses: bool = True, inputs: bool = True
) -> Evaluated:
    """``ev`` with devices renamed at wave boundaries where the whole step gets quicker and
    fits no worse (module docstring), or ``ev`` itself; ``losses`` / ``inputs`` False leave
    that kind of renaming out (to measure what each buys). A plan whose losses are already
    spread over groups (``Placement.loss_groups``) is left as it is: a renaming would have to
    carry its groups along."""
    if len(ev.placement.waves) < 2 or ev.placement.loss_groups:
        return ev
    kinds: list[Kind] = [kind for kind, on in (("inputs", inputs), ("losses", losses)) if on]
    best, trials, i = ev, 0, 0
    while i < len(kinds) and trials < MAX_TRIALS:
        got, used = _best_of(ctx, best, kinds[i], MAX_TRIALS - trials)
        trials += used
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
    ``loss_groups`` moved to their groups (``planner.evaluate.lossspread``)."""
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
