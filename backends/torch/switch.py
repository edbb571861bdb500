"""Switching a running job to the next phase's plan, without restarting any process.

At a phase boundary every rank holds the old plan's parts (and the parts it keeps parked) and
must end up holding the new plan's, with the weights and AdamW state they had, as if one
process had trained all along. The switch, on every rank at once:

1. compiles the new plan (``build_schedule``); a part whose holders stay the same moves
   nothing at all: every holder keeps its tensors, and the new optimizer adopts what the old
   one kept of the part's state (``take_part_state``, where the optimizer offers it);
2. gathers the whole optimizer state of every other part of the old plan onto its first
   holder, through the optimizer's per-part interface (``part_state``, the one checkpoints
   use), so how the optimizer keeps its state (sharded, replicated, bucketed) is its own
   business;
3. works out, identically everywhere, what each new holder of those parts lacks: a rank that
   held a part keeps its tensors; one that did not receives the weights from the part's first
   old holder (or from the rank keeping it parked); every new holder receives the whole state,
   which the new optimizer cuts into its shard (``load_part_state``). Parts no rank has held
   yet (a task training for the first time) are built from their seed, as at the start;
4. sends all of it with batched point-to-point (sizes first, then the tensors, one message of
   each per pair of ranks), builds the new plan's trainer around the kept and received parts,
   and loads the state;
5. parks the parts of tasks that leave on their first holder, weights and whole state, in
   host memory (the device keeps room for the phase that runs), until a later phase brings
   the task back.

An optimizer without ``take_part_state`` still works: its unchanged parts then go through
``part_state``/``load_part_state`` like the others (a gather and sends inside the group).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan

from .params import PartStore
from .parts import Part
from .phased import Parked, ParkedPart
from .schedule import build_schedule
from .trainer import Trainer

_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_KEYS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class Transfer:
    """What rank ``dst`` receives of ``part`` from ``src``: the whole optimizer state, and the
    weights too unless ``dst`` already holds them."""

    part: Part
    src: int
    dst: int
    weights: bool


@dataclass(frozen=True)
class SwitchStats:
    """One rank's view of a switch."""

    seconds: float
    sent_bytes: int  # weights and optimizer state this rank sent
    received_parts: int  # parts this rank received weights of
    kept_parts: int  # parts whose holders did not change (nothing of them moved)
    parked: int  # parts that left (parked somewhere) at this switch
    unparked: int  # parked parts that came back
    parked_bytes: int  # weights this rank keeps parked in host memory after the switch


def transfers(
    old: dict[Part, tuple[int, ...]],
    parked_at: dict[Part, int],
    new: tuple[tuple[Part, tuple[int, ...]], ...],
    kept: frozenset[Part] = frozenset(),
) -> tuple[Transfer, ...]:
    """Every transfer of a switch, in the new plan's global part order (the same list on
    every rank). ``old``: the old plan's holders; ``parked_at``: where parked parts are;
    ``kept``: parts that stay where they are, optimizer state included."""
    out = []
    for part, holders in new:
        if part in kept:
            continue
        if part in old:
            src, have = old[part][0], set(old[part])
        elif part in parked_at:
            src, have = parked_at[part], {parked_at[part]}
        else:
            continue  # never built yet: its holders build it from its seed
        out.extend(Transfer(part, src, h, h not in have) for h in holders if h != src)
    return tuple(out)


def switch(
    old: Trainer,
    graph: MetaGraph,
    plan: Plan,
    parked: Parked,
    make: Callable[[MetaGraph, Plan, PartStore], Trainer],
    *,
    rank: int,
    world_size: int,
    seed: int,
    dtype: torch.dtype,
) -> tuple[Trainer, SwitchStats]:
    """The trainer of ``plan``, holding what ``old`` and ``parked`` held, moved as the new
    plan places it (a collective: every rank calls it at the same step). ``parked`` is
    updated in place. ``make(graph, plan, store)`` builds a trainer around given parts."""
    t0 = time.perf_counter()
    schedule = build_schedule(graph, plan, world_size)
    before = old.schedule.holder_map
    after = schedule.holder_map
    # the same answer on every rank: every rank runs the same kind of optimizer
    handover = callable(getattr(old.opt, "take_part_state", None))
    kept = frozenset(p for p, h in after.items() if handover and before.get(p) == h)
    whole = {}
    for part, holders in old.schedule.holders:  # the global order: gathers meet
        if rank in holders and part not in kept:
            state = old.opt.part_state(part)
            if holders[0] == rank:
                whole[part] = state
    for part, keeping in parked.mine.items():
        whole[part] = keeping.state
    moves = transfers(before, parked.at, schedule.holders, kept)

    def module_of(part: Part) -> torch.nn.Module:
        return old.store[part] if part in old.store else parked.mine[part].module

    given = {p: module_of(p) for p in schedule.parts_of(rank) if p in old.store}
    for p in schedule.parts_of(rank):
        if p in parked.mine:  # coming back: from host memory to the device
            given[p] = parked.mine[p].module.to(old.device)
    store = PartStore(graph, schedule.parts_of(rank), seed, dtype, old.device, given=given)
    received, sent = _exchange(moves, rank, whole, module_of, store, old.device)
    new = make(graph, plan, store)
    for part in schedule.parts_of(rank):
        if part in kept:
            if not new.opt.take_part_state(part, old.opt):  # type: ignore[attr-defined]
                raise ExecutionError(f"internal: the optimizer did not keep {part.key}'s state")
            continue
        state = received.get(part, whole.get(part))
        if state is not None:
            new.opt.load_part_state(part, state)
    left = [p for p in before if p not in after]
    back = [p for p in parked.at if p in after]
    for part in back:
        del parked.at[part]
        parked.mine.pop(part, None)
    for part in left:
        parked.at[part] = before[part][0]
        if before[part][0] == rank:
            parked.mine[part] = ParkedPart(old.store[part].to("cpu"), whole[part])
    weights = sum(1 for m in moves if m.dst == rank and m.weights)
    stats = SwitchStats(
        time.perf_counter() - t0,
        sent,
        weights,
        len(kept),
        len(left),
        len(back),
        parked.bytes_here(),
    )
    return new, stats


# --- the wire ---------------------------------------------------------------------------------
def _trainable(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, t) for n, t in module.named_parameters() if t.requires_grad]


def _flat_weights(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in module.parameters()])


def _pack_state(module: torch.nn.Module, state) -> tuple[torch.Tensor, torch.Tensor | None, ...]:
    """(header, state values, steps): the header says whether there is state, its dtype and
    whether it holds fp32 master weights; values are each trainable parameter's keys in turn."""
    named = _trainable(module)
    if not named or not state or not state.get(named[0][0]):
        return torch.zeros(3, dtype=torch.float64), None, None
    master = "master" in state[named[0][0]]
    keys = (*_KEYS, "master") if master else _KEYS
    values, steps = [], []
    for name, _ in named:
        got = state.get(name) or {}
        if any(k not in got for k in keys):
            raise ExecutionError(f"internal: optimizer state of {name} lacks {keys}")
        values.extend(got[k].reshape(-1) for k in keys)
        steps.append(float(got["step"]))
    flat = torch.cat(values)
    header = torch.tensor([1.0, _DTYPES.index(flat.dtype), float(master)], dtype=torch.float64)
    return header, flat, torch.tensor(steps, dtype=torch.float64)


def _unpack_state(module: torch.nn.Module, header: torch.Tensor, flat, steps) -> dict:
    names = [n for n, _ in module.named_parameters()]
    out: dict[str, dict[str, torch.Tensor]] = {n: {} for n in names}
    if header[0] == 0:
        return out
    keys = (*_KEYS, "master") if header[2] else _KEYS
    start = 0
    for i, (name, t) in enumerate(_trainable(module)):
        entry = {"step": torch.tensor(float(steps[i]), dtype=torch.float32)}
        for key in keys:
            entry[key] = flat[start : start + t.numel()].reshape(t.shape).cpu()
            start += t.numel()
        out[name] = entry
    return out


def _state_size(module: torch.nn.Module, header: torch.Tensor) -> tuple[int, int]:
    named = _trainable(module)
    keys = 3 if header[2] else 2
    return keys * sum(t.numel() for _, t in named), len(named)


def _exchange(
    moves: tuple[Transfer, ...],
    rank: int,
    whole: dict,
    module_of: Callable[[Part], torch.nn.Module],
    store: PartStore,
    device: torch.device,
) -> tuple[dict[Part, dict], int]:
    """Run the transfers, one message of each kind per pair of ranks: first the headers
    (whether each part has state, its dtype, masters), then the weights, the state values and
    the step counts, each concatenated over the pair's parts in transfer order. Returns the
    whole states this rank received, and the bytes it sent."""
    out: dict[int, list[Transfer]] = {}
    into: dict[int, list[Transfer]] = {}
    for m in moves:
        if m.src == rank:
            out.setdefault(m.dst, []).append(m)
        elif m.dst == rank:
            into.setdefault(m.src, []).append(m)
    if not out and not into:
        return {}, 0
    packed = {m: _pack_state(module_of(m.part), whole.get(m.part)) for ms in out.values()
              for m in ms}  # fmt: skip
    ops = [
        dist.P2POp(dist.isend, torch.cat([packed[m][0] for m in ms]).to(device), peer, tag=0)
        for peer, ms in out.items()
    ]
    heads = {
        peer: torch.empty(3 * len(ms), dtype=torch.float64, device=device)
        for peer, ms in into.items()
    }
    ops += [dist.P2POp(dist.irecv, heads[peer], peer, tag=0) for peer in heads]
    _run(ops)
    ops, sent = [], 0
    for peer, ms in out.items():
        for tag, pieces in enumerate(_payload(ms, packed, module_of), start=1):
            if pieces:
                t = torch.cat(pieces).to(device)
                sent += t.numel() * t.element_size()
                ops.append(dist.P2POp(dist.isend, t, peer, tag=tag))
    inbox: dict[int, list[torch.Tensor | None]] = {}
    for peer, ms in into.items():
        head = heads[peer].cpu().view(-1, 3)
        sizes = _incoming(ms, head, store)
        inbox[peer] = []
        for tag, (count, dtype) in enumerate(sizes, start=1):
            buf = torch.empty(count, dtype=dtype, device=device) if count else None
            inbox[peer].append(buf)
            if buf is not None:
                ops.append(dist.P2POp(dist.irecv, buf, peer, tag=tag))
    _run(ops)
    received: dict[Part, dict] = {}
    for peer, ms in into.items():
        head = heads[peer].cpu().view(-1, 3)
        weights, values, steps = inbox[peer]
        at = [0, 0, 0]
        for m, h in zip(ms, head, strict=True):
            module = store[m.part]
            if m.weights:
                assert weights is not None
                with torch.no_grad():
                    for t in module.parameters():
                        t.copy_(weights[at[0] : at[0] + t.numel()].view_as(t))
                        at[0] += t.numel()
            size, count = _state_size(module, h) if h[0] else (0, 0)
            flat = values[at[1] : at[1] + size] if size else None
            counts = steps[at[2] : at[2] + count] if count else None
            at[1], at[2] = at[1] + size, at[2] + count
            received[m.part] = _unpack_state(module, h, flat, counts)
    return received, sent


def _payload(ms: list[Transfer], packed: dict, module_of) -> tuple[list, list, list]:
    """What a sender sends one peer: weights, state values, step counts (each a list of
    tensors to concatenate, in transfer order)."""
    weights = [_flat_weights(module_of(m.part)) for m in ms if m.weights]
    values = [packed[m][1] for m in ms if packed[m][1] is not None]
    steps = [packed[m][2] for m in ms if packed[m][2] is not None]
    if len({v.dtype for v in values}) > 1:
        raise ExecutionError("internal: optimizer states of different dtypes in one switch")
    return weights, values, steps


def _incoming(
    ms: list[Transfer], head: torch.Tensor, store: PartStore
) -> list[tuple[int, torch.dtype]]:
    """(elements, dtype) of the weights, state values and step counts a peer sends."""
    weights = sum(sum(t.numel() for t in store[m.part].parameters()) for m in ms if m.weights)
    like = next((next(store[m.part].parameters()) for m in ms if m.weights), None)
    sizes = [_state_size(store[m.part], h) for m, h in zip(ms, head, strict=True) if h[0]]
    dtype = next((_DTYPES[int(h[1])] for h in head if h[0]), torch.float32)
    return [
        (weights, like.dtype if like is not None else torch.float32),
        (sum(s for s, _ in sizes), dtype),
        (sum(c for _, c in sizes), torch.float64),
    ]


def _run(ops: list) -> None:
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
