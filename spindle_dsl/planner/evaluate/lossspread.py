"""Spread LM losses over every device that holds their head, so that no device's loss phase
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

from collections.abc import Collection, Mapping, Sequence

from spindle_dsl.cost.comm import ceil_div
from spindle_dsl.cost.step import PieceTime, StepModel, spread_shares
from spindle_dsl.cost.step_parts import SinkLoss
from spindle_dsl.planner.evaluate.build import (
    Evaluated,
    PlanContext,
    ms_change,
    time_of,
    transfer_of,
)
from spindle_dsl.planner.evaluate.placement import NodePool, PlacedPiece, Placement
from spindle_dsl.planner.evaluate.relabel import (
    Waves,
    loss_loads,
    overflow_bytes,
    placed,
    rename_devices,
    sink_loads,
)
from spindle_dsl.planner.evaluate.timing import loss_moves

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


def relabel_and_spread(ctx: PlanContext, ev: Evaluated, inputs: bool = True) -> Evaluated:
    """A placed plan's devices renamed where that pays, pieces onto their inputs and large
    losses beside small ones (``planner.evaluate.relabel``; ``inputs`` False leaves the inputs'
    renamings out, to measure what they buy), then lm losses spread over their heads' devices
    (``planner.evaluate.lossspread``), each kept where the whole step gets quicker."""
    return spread_losses(ctx, rename_devices(ctx, ev, inputs=inputs))


def spread_round(
    ctx: PlanContext,
    evaluated: Mapping[str, Evaluated],
    always: Collection[str],
    inputs: bool = True,
) -> dict[str, Evaluated]:
    """``relabel_and_spread`` over one round's candidates, quickest first, skipping those that
    could not become the quickest fitting plan even with their loss spread evenly and no
    moves left (``_floor``: relabeling moves the same loss work between devices, so the
    busiest carries at least the mean), except the names in ``always`` (the requested
    scheduler and the baselines, whose reported times must be priced the same way as the
    plan's)."""
    out = dict(evaluated)
    best = float("inf")
    for name in sorted(evaluated, key=lambda n: evaluated[n].iteration_s):
        ev = evaluated[name]
        if name in always or _floor(ctx, ev, inputs) < best:
            out[name] = ev = relabel_and_spread(ctx, ev, inputs)
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
