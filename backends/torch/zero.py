"""The distributed optimizer (ZeRO-1 and ZeRO-2): AdamW state, and optionally gradients,
sharded over the ranks that hold each part.

Every holder of a part keeps the part's weights whole (it runs the part), but the fp32 optimizer
state (Adam's ``exp_avg`` and ``exp_avg_sq``, plus fp32 master weights when the training dtype is
narrower than fp32) exists once over the holders: each owns a contiguous shard of the part's
flattened parameters (``shards.py``). A step, bucket by bucket:

1. the holders sum their gradients and each keeps the sum over its own shard (``grads.py``: one
   reduce-scatter per bucket, or on a backend without one an all-reduce of which each keeps its
   row, issued during the backward as soon as the bucket is ready). Stage 1 keeps full
   gradients through the micro-batch passes and reduces in the last; stage 2 reduce-scatters
   every pass into the gradient shard and frees the full gradients at once;
2. each steps AdamW on its shard alone, with torch's fused AdamW (``optim.adamw_step``), whose
   update is elementwise, so a shard gets what the whole tensor would;
3. an all-gather of the updated shards (asynchronous, one per bucket, waited for together at
   the end of the step) gives every holder the same new weights.

Steps 2 and 3 of a bucket run as soon as its final gradient shard is there and the earlier
buckets of its group (in the order all holders issue their collectives) are done: often while
the last pass's backward is still running on this rank's other parts, so a holder whose
backward ends early does not wait for this rank's whole backward before it gets its weights.
The weights themselves change only when the step copies the gathered rows in. With gradient
clipping no bucket is updated early: the clip factor needs the global norm, so the step first
waits for every gradient shard, sums the squares each rank owns over all ranks, and scales the
shards before it updates any.

A bucket with one holder needs none of this: its parts step in place, tensor by tensor, on
their own gradients, with the state shard (the whole part) viewed tensor by tensor. So the step
equals the unsharded one element by element, while a rank allocates state only for the
elements it owns. Checkpoints stay per part: ``part_state`` gathers a part's shards onto its
first holder in the per-parameter form the unsharded optimizer writes, and ``load_part_state``
cuts a holder's shard back out of it, whatever plan or world size wrote it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from spindle_dsl.errors import ExecutionError

from .grads import GradSync, _read_rows
from .optim import StepStats, adamw_step, clip_factor, scale_of, squares, world_sum
from .params import PartStore
from .parts import Part
from .schedule import Schedule
from .shards import MAX_BUCKET_ELEMENTS, MIN_BUCKET_ELEMENTS, Bucket, PartShard
from .trace import Tracer

STATE_KEYS = ("exp_avg", "exp_avg_sq")


def state_dtype(param_dtype: torch.dtype) -> torch.dtype:
    """Optimizer state is fp32 at least: a bf16 or fp16 model gets fp32 state and masters."""
    return param_dtype if torch.finfo(param_dtype).bits >= 32 else torch.float32


def gloo_has_reduce_scatter() -> bool:
    """Whether this torch's gloo implements reduce-scatter (2.13 does; older ones do not)."""
    return hasattr(dist, "ProcessGroupGloo") and hasattr(
        dist.ProcessGroupGloo, "_reduce_scatter_base"
    )


_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class _Shard:
    """What one rank keeps of one part's optimizer state: its shard only."""

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    master: torch.Tensor | None  # fp32 weights of the shard when the model trains in bf16/fp16


def _copy_range(tensors: Sequence[torch.Tensor], lo: int, hi: int, out: torch.Tensor) -> None:
    """``out`` = elements ``[lo, hi)`` of the tensors flattened one after another."""
    start = 0
    for t in tensors:
        a, b = max(lo, start), min(hi, start + t.numel())
        if a < b:
            out[a - lo : b - lo].copy_(t.reshape(-1)[a - start : b - start])
        start += t.numel()


def _views(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` (a whole part) viewed as tensors of the shapes of ``tensors``."""
    out, start = [], 0
    for t in tensors:
        out.append(flat[start : start + t.numel()].view_as(t))
        start += t.numel()
    return out


class ShardedAdamW:
    """AdamW over the parts ``rank`` holds, with each part's state (stage 1) and gradients
    (stage 2) sharded over its holders."""

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        store: PartStore,
        groups: dict[tuple[int, ...], dist.ProcessGroup],
        *,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float],
        eps: float,
        reduce_scatter: bool,
        stage: int = 1,
        ready: Mapping[Part, tuple[int, ...]] | None = None,
        tracer: Tracer | None = None,
        keep: Callable[[torch.Tensor, str], None] | None = None,
        max_bucket_elements: int = MAX_BUCKET_ELEMENTS,
        min_bucket_elements: int = MIN_BUCKET_ELEMENTS,
        clip_grad: float = 0.0,
        lr_scales: Sequence[tuple[str, float]] = (),
    ):
        if stage not in (1, 2):
            raise ExecutionError(f"the sharded optimizer runs ZeRO stage 1 or 2, not {stage}")
        self.rank, self.store, self.groups = rank, store, groups
        self.hyper = dict(lr=lr, weight_decay=weight_decay, beta1=betas[0], beta2=betas[1], eps=eps)
        self.clip_grad = clip_grad
        self.scale = scale_of(lr_scales)
        self.tracer = tracer or Tracer(rank, enabled=False)
        self.keep = keep or (lambda _t, _what: None)
        self.params: dict[Part, list[tuple[str, torch.nn.Parameter]]] = {}
        for part, name, t in store.trainable():
            self.params.setdefault(part, []).append((name, t))
        self.holders = schedule.holder_map
        self.sync = GradSync(
            schedule,
            rank,
            store,
            groups,
            stage=stage,
            reduce_scatter=reduce_scatter,
            tracer=self.tracer,
            ready=ready,
            keep=self.keep,
            max_bucket_elements=max_bucket_elements,
            min_bucket_elements=min_bucket_elements,
        )
        self.buckets: tuple[Bucket, ...] = self.sync.buckets
        self.shard_of = self.sync.shard_of
        self.state: dict[Part, _Shard] = {}
        self.steps: dict[Part, int] = dict.fromkeys(self.shard_of, 0)
        # Buckets of several holders are updated and gathered in their group's order (the order
        # all holders issue collectives in), each as soon as its final gradient shard is there
        # and the group's earlier ones are done: during the backward when it comes early.
        self._final: set[Bucket] = set()  # final gradient shard complete, not yet updated
        self._next: dict[tuple[int, ...], int] = {}  # per group: buckets updated this step
        self._gathers: list[tuple[Bucket, dist.Work, torch.Tensor]] = []
        # squares of the gradient this rank owns, summed as its buckets are updated; with
        # clipping the shards wait here, complete and scaled, for their update
        self._owned = torch.zeros((), dtype=torch.float64)
        self._clipped: dict[Bucket, torch.Tensor] = {}
        self.sync.on_final = None if clip_grad > 0 else self._update_early

    # --- the step -----------------------------------------------------------------------------
    def step(self, lr: float | None = None) -> StepStats:
        """Sum gradients over each part's holders, clip them (with ``clip_grad``), step the
        owned shards at ``lr`` (None: the last ``set_lr``'s), gather the weights."""
        if lr is not None:
            self.set_lr(lr)
        self.sync.finish()
        total = None
        with torch.no_grad():
            if self.clip_grad > 0:
                total = self._clip()
            for bucket in self.buckets:  # no communication: overlaps the others' collectives
                if len(bucket.holders) == 1:
                    with self.tracer.span("optimizer", "optimizer"):
                        self._step_in_place(bucket)
            self._advance(everything=True)
            gathers, self._gathers = self._gathers, []
            self._final.clear()
            self._next.clear()
            for bucket, work, rows in gathers:
                with self.tracer.span("gather parameters", "reduce"):
                    work.wait()
                with self.tracer.span("copy parameters", "optimizer"):
                    for ps in bucket.parts:
                        _read_rows(rows, ps, self._tensors(ps.part))
        for _, _, t in self.store.trainable():
            t.grad = None
        owned, self._owned = float(self._owned), torch.zeros((), dtype=torch.float64)
        return StepStats(owned, total)

    def set_lr(self, lr: float) -> None:
        """The base learning rate of the coming step: set before its passes, since a bucket
        may be updated during the last pass's backward."""
        self.hyper["lr"] = lr

    def _clip(self) -> float:
        """Wait for every gradient shard, sum the squares this rank owns over all ranks, and
        scale the shards and the single holder's gradients by the clip factor; the global
        squared norm."""
        self._clipped = {b: self.sync.shard(b) for b in self.buckets if len(b.holders) > 1}
        single = [t.grad for b in self.buckets if len(b.holders) == 1 for t in self._grads(b)]
        owned = squares(
            [*single, *(g for b, rows in self._clipped.items() for g in self._owned_rows(b, rows))]
        )
        total = world_sum(owned)
        factor = clip_factor(total, self.clip_grad)
        if factor < 1.0:
            for g in [*single, *self._clipped.values()]:
                g.mul_(factor)
        self._owned = owned
        return total

    def _grads(self, bucket: Bucket) -> list[torch.Tensor]:
        return [t for ps in bucket.parts for t in self._tensors(ps.part)]

    def _owned_rows(self, bucket: Bucket, mine: torch.Tensor) -> list[torch.Tensor]:
        """The pieces of this rank's row that are gradient (not a slot's padding)."""
        out = []
        for ps in bucket.parts:
            lo, hi = ps.bounds(self.rank)
            out.append(mine[ps.offset : ps.offset + hi - lo])
        return out

    def _count(self, tensors: Sequence[torch.Tensor]) -> None:
        """Add the squares of gradients this rank owns (without clipping: as they come)."""
        if self.clip_grad <= 0 and tensors:
            self._owned = self._owned.to(tensors[0].device) + squares(tensors)

    def _update_early(self, bucket: Bucket) -> None:
        """A bucket whose final gradient shard arrived while the backward still runs: update
        its shard and start the gather now, so the other holders need not wait for the rest
        of this rank's backward (the weights change only when the step copies them in)."""
        self._final.add(bucket)
        with torch.no_grad():
            self._advance(everything=False)

    def _advance(self, *, everything: bool) -> None:
        """Update and gather, group by group in the group's order, every bucket whose final
        shard is known complete (``everything``: all the rest, waiting for each)."""
        for holders, queue in self.sync.queues.items():
            if len(holders) == 1:
                continue
            i = self._next.get(holders, 0)
            while i < len(queue) and (everything or queue[i] in self._final):
                self._update_and_gather(queue[i])
                i += 1
            self._next[holders] = i

    def _update_and_gather(self, bucket: Bucket) -> None:
        mine = self._clipped.pop(bucket, None)
        if mine is None:
            mine = self.sync.shard(bucket)
        with self.tracer.span("optimizer", "optimizer"):
            own = self._update(bucket, mine)
        del mine  # the gradient shard, freed before the gather's buffer comes
        self._gathers.append(self._gather(bucket, own))

    def _tensors(self, part: Part) -> list[torch.nn.Parameter]:
        return [t for _, t in self.params[part]]

    def _step_in_place(self, bucket: Bucket) -> None:
        """A bucket of one holder: every part is whole here; step its tensors where they are."""
        lists: tuple[list[torch.Tensor], ...] = ([], [], [], [])
        steps: list[int] = []
        lrs: list[float] = []
        masters = []
        self._count([t.grad for t in self._grads(bucket)])
        for ps in bucket.parts:
            self.steps[ps.part] += 1
            tensors = self._tensors(ps.part)
            shard = self._shard(ps)
            if shard.master is not None:  # step the fp32 masters, then round into the weights
                grad = torch.cat([t.grad.reshape(-1) for t in tensors]).to(shard.master.dtype)
                items = [(shard.master, grad, shard.exp_avg, shard.exp_avg_sq)]
                masters.append((tensors, shard.master))
            else:
                items = zip(
                    tensors,
                    [t.grad for t in tensors],
                    _views(shard.exp_avg, tensors),
                    _views(shard.exp_avg_sq, tensors),
                    strict=True,
                )
            for item in items:
                for out, t in zip(lists, item, strict=True):
                    out.append(t)
                steps.append(self.steps[ps.part])
                lrs.append(self.hyper["lr"] * self.scale(ps.part))
        adamw_step(*lists, steps, self.hyper, lrs)
        for tensors, master in masters:
            for t, v in zip(tensors, _views(master, tensors), strict=True):
                t.copy_(v)

    def _update(self, bucket: Bucket, mine: torch.Tensor) -> torch.Tensor:
        """AdamW on every owned shard of the bucket, in one call; returns this rank's row of
        updated weights (in the training dtype) for the all-gather."""
        own = torch.empty_like(mine)
        lists: tuple[list[torch.Tensor], ...] = ([], [], [], [])
        steps: list[int] = []
        lrs: list[float] = []
        masters = []
        self._count(self._owned_rows(bucket, mine))
        for ps in bucket.parts:
            lo, hi = ps.bounds(self.rank)
            self.steps[ps.part] += 1
            if hi == lo:  # nothing of this part is ours
                continue
            shard = self._shard(ps)
            grad = mine[ps.offset : ps.offset + hi - lo]
            if shard.master is not None:
                weights, grad = shard.master, grad.to(shard.master.dtype)
                masters.append((ps, shard.master))
            else:
                weights = own[ps.offset : ps.offset + hi - lo]
                _copy_range(self._tensors(ps.part), lo, hi, weights)
            for out, t in zip(lists, (weights, grad, shard.exp_avg, shard.exp_avg_sq), strict=True):
                out.append(t)
            steps.append(self.steps[ps.part])
            lrs.append(self.hyper["lr"] * self.scale(ps.part))
        adamw_step(*lists, steps, self.hyper, lrs)
        for ps, master in masters:
            own[ps.offset : ps.offset + master.numel()].copy_(master)
        return own

    def _gather(self, bucket: Bucket, own: torch.Tensor) -> tuple[Bucket, dist.Work, torch.Tensor]:
        """Start gathering every holder's updated row (the caller waits and copies)."""
        rows = own.new_empty(len(bucket.holders), bucket.chunk)
        self.keep(rows, "buffers")
        work = _all_gather(rows.view(-1), own, group=self.groups[bucket.holders], async_op=True)
        return bucket, work, rows

    def _shard(self, ps: PartShard) -> _Shard:
        """The part's state shard, allocated at its first step (as torch's AdamW does)."""
        if ps.part not in self.state:
            lo, hi = ps.bounds(self.rank)
            tensors = self._tensors(ps.part)
            sdtype = state_dtype(tensors[0].dtype)
            device = tensors[0].device
            master = None
            if sdtype != tensors[0].dtype:
                master = torch.empty(hi - lo, dtype=tensors[0].dtype, device=device)
                _copy_range(tensors, lo, hi, master)
                master = master.to(sdtype)
            shard = _Shard(
                torch.zeros(hi - lo, dtype=sdtype, device=device),
                torch.zeros(hi - lo, dtype=sdtype, device=device),
                master,
            )
            for t in (shard.exp_avg, shard.exp_avg_sq, master):
                if t is not None:
                    self.keep(t, "optimizer")
            self.state[ps.part] = shard
        return self.state[ps.part]

    # --- checkpoints --------------------------------------------------------------------------
    def part_state(self, part: Part) -> dict[str, dict[str, torch.Tensor]] | None:
        """The part's whole optimizer state by parameter name, as CPU tensors, on its first
        holder (None on the others). A collective over the part's holders."""
        module = self.store[part]
        names = [n for n, _ in module.named_parameters()]
        ps = self.shard_of.get(part)
        if ps is None or self.steps[part] == 0:  # frozen, or not stepped yet: no state
            return {n: {} for n in names} if self._first(part) else None
        tensors = self._tensors(part)
        master = state_dtype(tensors[0].dtype) != tensors[0].dtype
        keys = (*STATE_KEYS, "master") if master else STATE_KEYS
        lo, hi = ps.bounds(self.rank)
        mine = torch.zeros(len(keys), ps.slot, dtype=state_dtype(tensors[0].dtype),
                           device=tensors[0].device)  # fmt: skip
        if hi > lo:
            shard = self.state[part]
            for row, key in enumerate(keys):
                mine[row, : hi - lo] = getattr(shard, key)
        k = len(ps.holders)
        if k > 1:
            dst = ps.holders[0]
            pieces = [torch.empty_like(mine) for _ in range(k)] if self.rank == dst else None
            dist.gather(mine, pieces, dst=dst, group=self.groups[ps.holders])
        else:
            pieces = [mine]
        if not self._first(part):
            return None
        whole = torch.cat(pieces, dim=1)[:, : ps.numel].cpu()
        out: dict[str, dict[str, torch.Tensor]] = {n: {} for n in names}
        step = torch.tensor(float(self.steps[part]), dtype=torch.float32)
        start = 0
        for name, t in self.params[part]:
            n = t.numel()
            out[name] = {"step": step.clone()}
            for row, key in enumerate(keys):
                out[name][key] = whole[row, start : start + n].reshape(t.shape).clone()
            start += n
        return out

    def load_part_state(self, part: Part, saved: dict[str, dict[str, torch.Tensor]]) -> None:
        """Take this rank's shard of a part's saved state (after its weights are loaded)."""
        ps = self.shard_of.get(part)
        if ps is None:
            return
        named = self.params[part]
        if not saved.get(named[0][0]):
            self.state.pop(part, None)
            self.steps[part] = 0
            return
        flat: dict[str, torch.Tensor] = {}
        for key in STATE_KEYS:
            pieces = []
            for name, t in named:
                got = saved.get(name, {}).get(key)
                if got is None or got.numel() != t.numel():
                    raise ExecutionError(f"saved optimizer state of {part.key}:{name} is unusable")
                pieces.append(got.reshape(-1))
            flat[key] = torch.cat(pieces)
        lo, hi = ps.bounds(self.rank)
        self.steps[part] = int(float(saved[named[0][0]]["step"]))
        self.state.pop(part, None)
        if hi == lo:
            return
        shard = self._shard(ps)  # a master, if any, starts from the loaded weights
        if shard.master is not None and all("master" in saved[n] for n, _ in named):
            shard.master.copy_(torch.cat([saved[n]["master"].reshape(-1) for n, _ in named])[lo:hi])
        for key in STATE_KEYS:
            getattr(shard, key).copy_(flat[key][lo:hi])

    def take_part_state(self, part: Part, other: object) -> bool:
        """Adopt what this rank keeps of ``part``'s state from ``other``, the optimizer of the
        previous plan of a run switching plans (``switch.py``), where the part had the same
        holders, so this rank's shard is the same slice: nothing moves. False if ``other``
        cannot hand it over so (then the switch moves it through ``part_state``)."""
        mine, theirs = self.shard_of.get(part), getattr(other, "shard_of", {}).get(part)
        if type(other) is not type(self) or mine is None or theirs is None:
            return False
        if (mine.numel, mine.holders) != (theirs.numel, theirs.holders):
            return False
        self.steps[part] = other.steps[part]  # type: ignore[attr-defined]
        kept = other.state.get(part)  # type: ignore[attr-defined]
        if kept is None:
            self.state.pop(part, None)
        else:
            self.state[part] = kept
        return True

    def _first(self, part: Part) -> bool:
        return self.holders[part][0] == self.rank

    def state_elements(self) -> dict[str, int]:
        """Optimizer-state elements this rank holds, by part key (memory accounting)."""
        out = {}
        for part, s in self.state.items():
            extra = s.master.numel() if s.master is not None else 0
            out[part.key] = s.exp_avg.numel() + s.exp_avg_sq.numel() + extra
        return out

    def state_bytes(self) -> int:
        tensors = [t for s in self.state.values() for t in (s.exp_avg, s.exp_avg_sq, s.master)]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)
