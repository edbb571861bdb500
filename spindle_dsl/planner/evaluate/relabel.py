"""One search over device renamings at wave boundaries, weighing activation moves and the
loss phase together on the priced step.

Renaming devices by one permutation in every wave from a cut on (or in every wave before it)
keeps every wave a valid wave and changes only what crosses the cut: its activation moves,
the parameter holders of modules run on both sides, each device's memory, and which devices
end which sinks. Two kinds of renaming are proposed:

- **inputs** (``planner.evaluate.cutmatch``): the pieces just after a boundary whose moves show in
  the step put on their sources' devices, undoing what placement, wave by wave, could not
  take back;
- **losses** (``planner.evaluate.lossbalance``): the sinks whose loss heads pile up on the same
  devices paired, large losses with small ones, across the cut between their last pieces.

Why one search. The two pull against each other: pairing the losses renames whole groups
across nodes and puts pieces off their inputs, matching the inputs can pile the losses back.
Run once each, one after the other, the second undoes part of the first; taking each round's
quickest proposal of either kind does worse still, since the loss pairings gain most at once
and leave the search where no matching gains. So the search descends through the two kinds in
turn (a variable-neighbourhood descent): the inputs' renamings round after round, each round
keeping its quickest proposal, until none gains; then the losses' pairings, one round; after
any gain, the inputs' again first; it ends when neither kind gains, or after ``MAX_TRIALS``
pricings. Every proposal is priced with the same step model as any plan (transfers, gradient
reduction, optimizer, losses; timed first, its memory ledgered only when it is quicker) and
kept only where it fits no worse. On ``bench/specs/ofasys_7task`` at 16 devices this descent
ends on a quicker step than the loss pairings alone, the matchings run to the end before them,
or each round's quickest of both kinds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from spindle_dsl.planner.evaluate.build import Evaluated, PlanContext, ms_change, time_of
from spindle_dsl.planner.evaluate.cutmatch import cuts_with_moves, matching_label
from spindle_dsl.planner.evaluate.lossbalance import (
    candidates,
    overflow_bytes,
    placed,
    relabeled,
    sink_loads,
    spread,
    worth_spreading,
)
from spindle_dsl.planner.evaluate.placement import Placement

MAX_TRIALS = 48  # step pricings per plan, at most
RENAME_NOTE = "devices renamed at wave boundaries"  # how a renamed plan's note begins

Kind = Literal["inputs", "losses"]  # the two kinds of renaming (module docstring)


def proposals(ctx: PlanContext, ev: Evaluated, kind: Kind) -> Iterator[tuple[int, bool, list[int]]]:
    """(cut, prefix, label) of each renaming of ``kind`` worth pricing for ``ev``: for
    ``"inputs"``, the matchings at each boundary whose moves show
    (``cutmatch.cuts_with_moves``), after it and before it; for ``"losses"``, the pairings
    whose loss phase could be ``lossbalance.MIN_GAIN`` of the step shorter, both ways of
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
