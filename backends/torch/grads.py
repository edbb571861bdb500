"""Gradient reduction inside each parameter device group, bucketed and overlapped with backward.

A part's gradient is accumulated locally over every task and MetaOp a rank ran with it (autograd
adds into ``.grad``), and then summed over the ranks that hold the part: its parameter device
group. Parts with the same holders travel together in buckets (``shards.py``), one collective
per bucket, issued asynchronously as soon as the bucket is ready, as DDP does:

- In which stage a part becomes final on a rank is known from the schedule: the last stage
  of the backward on that rank that touches the part (``ready_ticks``), counting a LM head
  as touched by the loss. Shared parts get gradient from several MetaOps, so their last one
  counts. Inside that stage, autograd says when: the executor announces each stage's
  backward (``backward_begin``) and each parameter's accumulation hook counts down its
  bucket, which is issued at its last gradient, while the stage's backward runs on through
  its earlier layers (buckets are cut in the backward's order, later layers first). The
  executor also reports each finished tick (``backward_done``), which issues whatever the
  hooks did not (the loss's tick, a parameter that got no gradient). A bucket is issued only
  after every earlier bucket of its group (in the order all holders agree on), so the
  collectives of a group never cross, while the backward of the rest of the step runs on.
- With ``k`` micro-batches the passes accumulate into ``.grad`` and only the last pass reduces,
  unless gradients are sharded (ZeRO-2), where every pass reduce-scatters its buckets into
  the rank's gradient shard, which accumulates over the passes, and frees the full-size
  gradients at once (DeepSpeed's stage 2).
- ``finish`` issues what is left; the optimizer then waits for each bucket before it uses it.

What a bucket gives back depends on the optimizer: the unsharded one (stage 0) all-reduces a
flat buffer and gets every gradient back as a view of it; the sharded ones (stages 1 and 2)
reduce-scatter the bucket's rows (or, on a backend without reduce-scatter, all-reduce them and
keep their own row) and get this rank's shard of the summed gradient, the one slice of it
their optimizer shard needs. Stage 1 keeps full gradients until the last pass (they
accumulate there), stage 2 only until the pass's bucket is issued.

Bucket buffers are allocated when a bucket is issued and freed when its reduction has been
used, not kept from step to step as DDP keeps its buckets: a persistent buffer would hold a
copy of the gradients through the forward, where a step's memory peaks. What that costs is the
first touch of fresh pages: filling a fresh buffer takes longer than filling a reused one, a
small share of a CPU step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph, MetaOp

from .params import PartStore
from .parts import Part
from .schedule import Schedule, layer_module
from .shards import MAX_BUCKET_ELEMENTS, MIN_BUCKET_ELEMENTS, Bucket, PartShard, plan_buckets
from .trace import Tracer

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def holder_groups(schedule: Schedule, rank: int) -> dict[tuple[int, ...], dist.ProcessGroup]:
    """A process group per set of ranks that holds some part together, for the sets ``rank``
    is in. A collective: every rank creates every group, in the same (sorted) order, as
    ``new_group`` requires, even the groups it is not a member of."""
    sets = sorted({ranks for _, ranks in schedule.holders if len(ranks) > 1})
    groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
    for ranks in sets:
        group = dist.new_group(list(ranks))
        if rank in ranks:
            groups[ranks] = group
    return groups


def ready_ticks(graph: MetaGraph, schedule: Schedule) -> dict[Part, tuple[int, ...]]:
    """Per part, per holder (in the part's holders order): the backward tick after which the
    holder adds nothing more to the part's gradient. Tick 0 is the loss (LM heads), tick
    ``n_waves - w`` the backward of wave ``w``; a holder's last backward touching the part is
    the earliest wave in which it runs a stage with the part (input stages go with a chain's
    first stage)."""
    latest: dict[tuple[Part, int], int] = {}
    n = schedule.n_waves

    def touch(part: Part, devices: tuple[int, ...], tick: int) -> None:
        for d in devices:
            latest[(part, d)] = max(latest.get((part, d), 0), tick)

    for op_id, chain in schedule.chains:
        op = graph.op(op_id)
        for stage in chain:
            for part in stage_parts(op, stage.first, stage.end):
                touch(part, stage.devices, n - stage.wave)
    return {
        part: tuple(latest.get((part, d), 0) for d in holders) for part, holders in schedule.holders
    }


def stage_parts(op: MetaOp, first: int, end: int) -> list[Part]:
    """The parts a stage of ``op`` running layers ``[first, end)`` touches: its layers, and its
    input stages when it starts the chain (as ``schedule._holders`` assigns them)."""
    parts = []
    for g in range(first, end):
        module, j = layer_module(op, g)
        parts.append(Part(module, f"layer.{j}"))
    if first == 0:
        module = op.segments[0][0]
        parts += [Part(module, f"input.{i.source}") for i in op.inputs if i.from_modality]
    return parts


@dataclass
class _Pending:
    """A bucket's collective in flight: its handle and the buffers it works on."""

    work: dist.Work
    rows: torch.Tensor  # k x chunk (sharded) or the flat gradients (unsharded)
    out: torch.Tensor | None  # this rank's reduced row (reduce-scatter)


class GradSync:
    """Issues, and later waits for, the gradient collectives of one rank's buckets."""

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        store: PartStore,
        groups: dict[tuple[int, ...], dist.ProcessGroup],
        *,
        stage: int,
        reduce_scatter: bool = True,
        tracer: Tracer | None = None,
        ready: Mapping[Part, tuple[int, ...]] | None = None,
        keep: Callable[[torch.Tensor, str], None] | None = None,
        max_bucket_elements: int = MAX_BUCKET_ELEMENTS,
        min_bucket_elements: int = MIN_BUCKET_ELEMENTS,
    ):
        """``ready``: each part's ready tick per holder (``ready_ticks``); without it every
        bucket waits for the end of the backward. ``keep(tensor, what)`` tells the memory
        meter about a buffer this creates. ``min_bucket_elements``: the size below which a
        bucket stays open across ticks (``shards.least_bucket_elements``)."""
        self.rank, self.store, self.groups, self.stage = rank, store, groups, stage
        self.reduce_scatter = reduce_scatter
        self.tracer = tracer or Tracer(rank, enabled=False)
        self.keep = keep or (lambda _t, _what: None)
        self.params: dict[Part, list[torch.nn.Parameter]] = {}
        for part, _, t in store.trainable():
            self.params.setdefault(part, []).append(t)
        holders = schedule.holder_map
        self.buckets: tuple[Bucket, ...] = plan_buckets(
            (
                (p, holders[p], sum(t.numel() for t in self.params[p]))
                for p in store.parts
                if p in self.params
            ),
            max_bucket_elements,
            ready,
            min_bucket_elements,
        )
        self.shard_of: dict[Part, PartShard] = {ps.part: ps for b in self.buckets for ps in b.parts}
        # per group, its buckets in the order every holder issues them
        self.queues: dict[tuple[int, ...], list[Bucket]] = {}
        for b in self.buckets:
            self.queues.setdefault(b.holders, []).append(b)
        self._next: dict[tuple[int, ...], int] = {}  # per group: buckets issued this pass
        self._pending: dict[Bucket, _Pending] = {}
        self._shards: dict[Bucket, torch.Tensor] = {}
        self._reducing = True
        self._last = False  # in the step's last pass: a completed reduction is final
        self._final: list[Bucket] = []  # final reductions not yet handed to ``on_final``
        # called with each bucket of several holders whose final gradient shard is ready while
        # the last pass's backward still runs (the sharded optimizer updates it there)
        self.on_final: Callable[[Bucket], None] | None = None
        # issuing inside a stage (``backward_begin``): the tick whose backward runs, and per
        # bucket that becomes final in it, how many of its parameters have yet to receive
        # their last gradient. Buckets and parameters are keyed by ``id`` here: the hooks run
        # once per parameter and backward, and a bucket's own hash walks all its parts.
        self._ready = ready
        self._tick: int | None = None
        self._left: dict[int, int] = {}
        self._got: set[int] = set()  # parameters that received it in this tick
        self._early: set[int] = set()  # buckets whose gradients became final in this tick
        self._bucket_of: dict[int, Bucket] = {}
        self._hooks: list = []  # the hooks' handles (they live as long as the parameters)
        if ready is not None:
            for b in self.buckets:
                if len(b.holders) < 2:
                    continue
                for ps in b.parts:
                    for t in self.params[ps.part]:
                        self._bucket_of[id(t)] = b
                        self._hooks.append(t.register_post_accumulate_grad_hook(self._accumulated))

    # --- the executor's calls -------------------------------------------------------------------
    def begin_pass(self, index: int, count: int) -> None:
        """Pass ``index`` of ``count`` starts: it reduces if it is the last, or always when
        gradients are sharded (stage 2)."""
        self._reducing = self.stage >= 2 or index == count - 1
        self._next = {}
        # the previous pass's collectives (stage 2) end here, so their transient rows do not
        # live on through this pass's forward
        for bucket in list(self._pending):
            self._complete(bucket)
        self._last = index == count - 1

    def backward_begin(self, tick: int) -> None:
        """Backward tick ``tick`` (a wave's stage; not the loss, tick 0, whose heads may take
        several backward calls) is about to run: each bucket whose gradients become final in
        it is issued from the accumulation hook of its last parameter, while the rest of the
        stage's backward runs on (a stage finishes its last layer first), as DDP issues its
        buckets; a wave's single backward call gives each parameter one accumulation."""
        self._tick, self._got = None, set()
        self._left.clear()
        self._early.clear()
        if not self._reducing or tick <= 0 or self._ready is None:
            return
        self._tick = tick
        for b in self.buckets:
            if len(b.holders) < 2 or b.ready_on(self.rank) != tick:
                continue
            i = b.holders.index(self.rank)
            self._left[id(b)] = sum(
                len(self.params[ps.part]) for ps in b.parts if self._ready[ps.part][i] == tick
            )

    def _accumulated(self, param: torch.Tensor) -> None:
        """A parameter's gradient was accumulated (autograd's hook): issue its bucket, and any
        of its group's queue it unblocks, if that was the bucket's last final gradient."""
        if self._tick is None:
            return
        bucket = self._bucket_of.get(id(param))
        if bucket is None or id(bucket) not in self._left:
            return
        if id(param) in self._got:
            raise ExecutionError(
                f"internal: a parameter of {bucket.parts[0].part} received two gradients in "
                f"one backward stage; its bucket goes out at its parameters' last gradient"
            )
        self._got.add(id(param))
        self._left[id(bucket)] -= 1
        if self._left[id(bucket)] == 0:
            self._early.add(id(bucket))
            self._issue_queue(bucket.holders, self._tick - 1)

    def _issue_queue(self, holders: tuple[int, ...], tick: int) -> None:
        """Issue the group's buckets in order while each is ready by ``tick`` or final early."""
        queue = self.queues[holders]
        i = self._next.get(holders, 0)
        while i < len(queue) and (
            queue[i].ready_on(self.rank) <= tick or id(queue[i]) in self._early
        ):
            self._issue(queue[i])
            i += 1
        self._next[holders] = i

    def backward_done(self, tick: int) -> None:
        """Backward tick ``tick`` of the pass is over: issue every bucket it made ready, in
        its group's order."""
        self._tick = None
        if not self._reducing:
            return
        for bucket, pending in list(self._pending.items()):  # free what is done already
            if pending.work.is_completed():
                self._complete(bucket)
        while self._final and self.on_final is not None:
            self.on_final(self._final.pop(0))
        for holders in self.queues:
            self._issue_queue(holders, tick)
        self._early.clear()  # issued now: a later pass's buckets are final only in that pass
        self._left.clear()

    def finish(self) -> None:
        """Issue every bucket the step has not issued yet (all are ready once the backward is
        over; an optimizer stepped without the executor issues them all here)."""
        self._reducing = True
        self.backward_done(1 << 30)
        self._next = {}
        self._last = False
        self._final.clear()

    # --- what the optimizer takes -------------------------------------------------------------
    def shard(self, bucket: Bucket) -> torch.Tensor:
        """This rank's row of the bucket's summed gradients (``chunk`` elements), once its
        collective is done (sharded optimizer, buckets of several holders: a bucket of one
        holder leaves its gradients in ``.grad``)."""
        self._complete(bucket)
        return self._shards.pop(bucket)

    def wait_all(self) -> None:
        """Wait for every collective (unsharded optimizer: the gradients are then summed)."""
        for bucket in list(self._pending):
            self._complete(bucket)

    # --- inside -------------------------------------------------------------------------------
    def _issue(self, bucket: Bucket) -> None:
        if bucket in self._pending:  # the previous pass's collective (stage 2)
            self._complete(bucket)
        with self.tracer.span("issue gradients", "reduce"):
            if self.stage == 0:
                self._issue_flat(bucket)
            else:
                self._issue_rows(bucket)

    def _issue_flat(self, bucket: Bucket) -> None:
        """Unsharded: all-reduce the gradients as one flat buffer; they become views of it."""
        tensors = [t for ps in bucket.parts for t in self.params[ps.part]]
        if len(bucket.holders) == 1:
            for t in tensors:
                if t.grad is None:
                    t.grad = torch.zeros_like(t)
            return
        flat = torch.cat(
            [t.grad.reshape(-1) if t.grad is not None else t.new_zeros(t.numel()) for t in tensors]
        )
        self.keep(flat, "gradients")
        start = 0
        for t in tensors:
            t.grad = flat[start : start + t.numel()].view_as(t)
            start += t.numel()
        work = dist.all_reduce(flat, group=self.groups[bucket.holders], async_op=True)
        self._pending[bucket] = _Pending(work, flat, None)

    def _issue_rows(self, bucket: Bucket) -> None:
        """Sharded: lay the gradients into the holders' rows and reduce-scatter them; the full
        gradients are freed (ZeRO frees them here; the bucket's rows are the transient copy)."""
        k = len(bucket.holders)
        if k == 1:  # nothing to sum: the optimizer steps the gradients where they are
            for ps in bucket.parts:
                for t in self.params[ps.part]:
                    if t.grad is None:
                        t.grad = torch.zeros_like(t)
            return
        some = self.params[bucket.parts[0].part][0]
        rows = some.new_empty(k, bucket.chunk)
        self.keep(rows, "buffers")
        for ps in bucket.parts:
            tensors = self.params[ps.part]
            _fill_rows(rows, ps, [(t.grad, t.numel()) for t in tensors])
            for t in tensors:
                t.grad = None
        out = None
        if self.reduce_scatter:
            out = rows.new_empty(bucket.chunk)
            work = _reduce_scatter(
                out, rows.view(-1), group=self.groups[bucket.holders], async_op=True
            )
        else:
            work = dist.all_reduce(rows, group=self.groups[bucket.holders], async_op=True)
        self._pending[bucket] = _Pending(work, rows, out)

    def _complete(self, bucket: Bucket) -> None:
        pending = self._pending.pop(bucket, None)
        if pending is None:
            return
        with self.tracer.span("wait gradients", "reduce"):
            pending.work.wait()
        if self.stage == 0:
            return
        if pending.out is not None:
            mine = pending.out
        else:  # all-reduced rows: keep only this rank's
            mine = pending.rows[bucket.holders.index(self.rank)].clone()
        have = self._shards.get(bucket)
        if have is None:
            self.keep(mine, "gradients")
            self._shards[bucket] = mine
        else:
            have.add_(mine)
        if self._last:
            self._final.append(bucket)


def _fill_rows(
    rows: torch.Tensor, ps: PartShard, grads: list[tuple[torch.Tensor | None, int]]
) -> None:
    """Lay a part's gradients ((gradient or None for zeros, elements) per parameter) into its
    slot of every row, copying each element once: row ``i`` gets elements ``[i*S, (i+1)*S)``
    of the part flattened, then zeros up to the slot's end."""
    s = ps.slot
    for i in range(len(ps.holders)):
        lo, hi = min(i * s, ps.numel), min((i + 1) * s, ps.numel)
        dest = rows[i, ps.offset : ps.offset + s]
        start = 0
        for g, n in grads:
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                piece = dest[a - lo : b - lo]
                if g is not None:
                    piece.copy_(g.reshape(-1)[a - start : b - start])
                else:
                    piece.zero_()
            start += n
        if hi - lo < s:
            dest[hi - lo :].zero_()


def _read_rows(rows: torch.Tensor, ps: PartShard, tensors: list[torch.Tensor]) -> None:
    """The inverse of ``_fill_rows``: copy the part's slots of every row into ``tensors`` (the
    part's parameters, in order), each element once and straight into place."""
    s = ps.slot
    for i in range(len(ps.holders)):
        lo, hi = min(i * s, ps.numel), min((i + 1) * s, ps.numel)
        source = rows[i, ps.offset : ps.offset + s]
        start = 0
        for t in tensors:
            n = t.numel()
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                t.view(-1)[a - start : b - start].copy_(source[a - lo : b - lo])
            start += n
