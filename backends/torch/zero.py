"""The distributed optimizer (ZeRO-1): AdamW state sharded over the ranks that hold each part.

Every holder of a part keeps the part's weights and gradients whole (it runs the part), but the
fp32 optimizer state (Adam's ``exp_avg`` and ``exp_avg_sq``, plus fp32 master weights when the
training dtype is narrower than fp32) exists once over the holders: each owns a contiguous shard
of the part's flattened parameters (``shards.py``). A step, bucket by bucket:

1. the holders sum their gradients and each keeps the sum over its own shard: one
   reduce-scatter, or on a backend without one, an all-reduce of which each keeps its rows;
2. each steps AdamW on its shard alone, with torch's own functional AdamW
   (``torch.optim.adamw.adamw``, per tensor: ``foreach=False``, as ``make_optimizer`` asks of
   ``torch.optim.AdamW``), whose update is elementwise, so a shard gets bit for bit what the whole
   tensor would;
3. one all-gather of the updated shards gives every holder the same new weights.

So the step equals the unsharded one element by element, while a rank allocates state only for
the elements it owns. Checkpoints stay per part: ``part_state`` gathers a part's shards onto its
first holder in the per-parameter form the unsharded optimizer writes, and ``load_part_state``
cuts a holder's shard back out of it, whatever plan or world size wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.optim.adamw import adamw

from spindle_dsl.errors import ExecutionError

from .params import PartStore
from .parts import Part
from .schedule import Schedule
from .shards import MAX_BUCKET_ELEMENTS, Bucket, PartShard, plan_buckets
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


_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class _Shard:
    """What one rank keeps of one part's optimizer state: its shard only."""

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    master: torch.Tensor | None  # fp32 weights of the shard when the model trains in bf16/fp16
    step: torch.Tensor  # a CPU scalar, as torch keeps it


def _copy_range(tensors: Sequence[torch.Tensor], lo: int, hi: int, out: torch.Tensor) -> None:
    """``out`` = elements ``[lo, hi)`` of the tensors flattened one after another."""
    start = 0
    for t in tensors:
        a, b = max(lo, start), min(hi, start + t.numel())
        if a < b:
            out[a - lo : b - lo].copy_(t.reshape(-1)[a - start : b - start])
        start += t.numel()


def _scatter_rows(rows: torch.Tensor, ps: PartShard, flat: torch.Tensor) -> None:
    """Lay a flattened part into its slot of every row: row ``i`` gets shard ``i``."""
    s, n = ps.slot, ps.numel
    q, r = divmod(n, s)
    rows[:q, ps.offset : ps.offset + s] = flat[: q * s].view(q, s)
    if r:
        rows[q, ps.offset : ps.offset + r] = flat[q * s :]


def _gather_rows(rows: torch.Tensor, ps: PartShard) -> torch.Tensor:
    """The flattened part back from its slots (inverse of ``_scatter_rows``)."""
    s, n = ps.slot, ps.numel
    q, r = divmod(n, s)
    whole = rows[:q, ps.offset : ps.offset + s].reshape(-1)
    return torch.cat([whole, rows[q, ps.offset : ps.offset + r]]) if r else whole


class ShardedAdamW:
    """AdamW over the parts ``rank`` holds, with each part's state sharded over its holders."""

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
        tracer: Tracer | None = None,
        max_bucket_elements: int = MAX_BUCKET_ELEMENTS,
    ):
        self.rank, self.store, self.groups = rank, store, groups
        self.hyper = dict(lr=lr, weight_decay=weight_decay, beta1=betas[0], beta2=betas[1], eps=eps)
        self.reduce_scatter = reduce_scatter
        self.tracer = tracer or Tracer(rank, enabled=False)
        self.params: dict[Part, list[tuple[str, torch.nn.Parameter]]] = {}
        for part, name, t in store.trainable():
            self.params.setdefault(part, []).append((name, t))
        self.holders = holders = schedule.holder_map
        self.buckets: tuple[Bucket, ...] = plan_buckets(
            (
                (p, holders[p], sum(t.numel() for _, t in self.params[p]))
                for p in store.parts
                if p in self.params
            ),
            max_bucket_elements,
        )
        self.shard_of = {ps.part: ps for b in self.buckets for ps in b.parts}
        self.state: dict[Part, _Shard] = {}
        self.steps: dict[Part, int] = dict.fromkeys(self.shard_of, 0)

    # --- the step -----------------------------------------------------------------------------
    def step(self) -> None:
        """Sum gradients over each part's holders, step the owned shards, gather the weights."""
        self.store.fill_missing_grads()
        with torch.no_grad():
            for bucket in self.buckets:
                self._step_bucket(bucket)
        for _, _, t in self.store.trainable():
            t.grad = None

    def _tensors(self, part: Part) -> list[torch.nn.Parameter]:
        return [t for _, t in self.params[part]]

    def _step_bucket(self, bucket: Bucket) -> None:
        some = self._tensors(bucket.parts[0].part)[0]
        rows = torch.zeros(len(bucket.holders), bucket.chunk, dtype=some.dtype, device=some.device)
        for ps in bucket.parts:
            _scatter_rows(rows, ps, torch.cat([t.grad.reshape(-1) for t in self._tensors(ps.part)]))
        with self.tracer.span("reduce gradients", "reduce"):
            mine = self._reduce(bucket, rows)
        del rows  # the bucket's gradients, a transient copy
        with self.tracer.span("optimizer", "optimizer"):
            own = self._update(bucket, mine)
        with self.tracer.span("gather parameters", "reduce"):
            self._gather(bucket, own)

    def _reduce(self, bucket: Bucket, rows: torch.Tensor) -> torch.Tensor:
        """This rank's row of the holders' summed gradient rows."""
        if len(bucket.holders) == 1:
            return rows[0]
        group = self.groups[bucket.holders]
        if self.reduce_scatter:
            mine = rows.new_empty(bucket.chunk)
            _reduce_scatter(mine, rows.view(-1), group=group)
            return mine
        dist.all_reduce(rows, group=group)
        return rows[bucket.holders.index(self.rank)].clone()

    def _update(self, bucket: Bucket, mine: torch.Tensor) -> torch.Tensor:
        """AdamW on every owned shard of the bucket, in one call; returns this rank's row of
        updated weights (in the training dtype) for the all-gather."""
        own = torch.empty_like(mine)
        lists: tuple[list[torch.Tensor], ...] = ([], [], [], [], [])
        masters = []
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
            shard.step.fill_(float(self.steps[ps.part] - 1))  # adamw counts it up itself
            for out, t in zip(
                lists, (weights, grad, shard.exp_avg, shard.exp_avg_sq, shard.step), strict=True
            ):
                out.append(t)
        if lists[0]:
            adamw(*lists[:4], [], lists[4], foreach=False, amsgrad=False, maximize=False,
                  **self.hyper)  # fmt: skip
        for ps, master in masters:
            own[ps.offset : ps.offset + master.numel()].copy_(master)
        return own

    def _gather(self, bucket: Bucket, own: torch.Tensor) -> None:
        """Every holder's updated row, back into the parameters of every holder."""
        k = len(bucket.holders)
        if k == 1:
            rows = own.view(1, -1)
        else:
            rows = own.new_empty(k, bucket.chunk)
            _all_gather(rows.view(-1), own, group=self.groups[bucket.holders])
        for ps in bucket.parts:
            flat, start = _gather_rows(rows, ps), 0
            for t in self._tensors(ps.part):
                t.copy_(flat[start : start + t.numel()].view_as(t))
                start += t.numel()

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
            self.state[ps.part] = _Shard(
                torch.zeros(hi - lo, dtype=sdtype, device=device),
                torch.zeros(hi - lo, dtype=sdtype, device=device),
                master,
                torch.tensor(0.0, dtype=torch.float32),
            )
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
