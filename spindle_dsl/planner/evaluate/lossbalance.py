"""Spread the loss phase: relabel devices on one side of a wave boundary so that the LM
sinks' losses do not pile up on the same few devices.

The runtime computes every sink's loss heads after the last forward wave, on the devices of
the sink's last piece (``cost.step``, ``loss_s``; unless its loss is spread, which
``planner.evaluate.lossspread`` decides after this), so a device that ends two sinks computes both
losses while the others wait. Placement cannot see this when it places a sink's first
piece (its later pieces follow it, and the other sinks are placed waves later), and a
concurrent plan whose sinks end on overlapping device groups can lose much of what its waves
gained: with vocabulary-sized heads the loss phase is several percent of a step (qwen_val at
16 devices, where two sinks can end on the same devices, is such a plan).

Renaming devices by one permutation in every wave before a cut (or in every wave from it
on) keeps every wave a valid wave (the same pieces, on groups of the same sizes, still
disjoint) and changes only what crosses the cut: which later pieces meet which earlier ones
on a device (the activation transfers at the cut, the parameter holders, each device's
memory) and which devices end which sinks. For each way of splitting the sinks by where
their last piece lies, the losses that move (``a``) are paired with those that stay (``b``):
greedily, the busiest device exchanges with the one that lowers the pair's larger load the
most (``spread``), which reaches the bottleneck pairing's peak (``best_peak``) while moving
few devices. Which pairings are priced, and which kept, the search over renamings decides
(``planner.evaluate.relabel``, beside the renamings that put pieces on their inputs): only those
whose loss phase could be at least ``MIN_GAIN`` of the step shorter are priced, and a round of
candidates spreads only those that could still become the quickest (``spread_round``). It
changes nothing where the loss is already even (the sequential plan's sinks each end on every
device).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from spindle_dsl.cost.step import PieceTime, StepModel, spread_share
from spindle_dsl.planner.evaluate.build import PlanContext
from spindle_dsl.planner.evaluate.placement import PlacedPiece, Placement
from spindle_dsl.planner.model.problem import Piece

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
