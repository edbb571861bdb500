"""Where each holder's shard of a part's gradients and optimizer state lies, and how parts are
bucketed for their gradient reduction, in plain Python.

A part's trainable parameters, flattened in module order, form one vector of ``numel``
elements; its ``k`` holders split it into the contiguous ceil-split shards the batch uses
(``shard_bounds``): holder ``i`` owns ``[i*S, (i+1)*S)`` clipped to ``numel``, ``S = ceil(numel /
k)``, so the last shards may be short or empty. Keeping the split per part is what lets a
checkpoint stay per part: a part's state is reassembled from its own holders alone, and any
other plan re-splits it over its own holders.

Parts with the same holders travel together in a bucket, so a step issues one collective per
bucket, not per part. A bucket's communication buffer is ``k`` rows (one per holder) of
``chunk`` elements: row ``i`` is holder ``i``'s shard of every part of the bucket, each in a
slot of ``S`` elements at the part's ``offset`` (slots are padded to ``S`` so every row has the
same length, which reduce-scatter and all-gather need).

Buckets follow the backward pass, as DDP's do. Each part has, on each holder, a *ready tick*:
the point of the backward after which no stage of that rank adds to the part's gradient any
more (its last backward on the rank). Ticks count the backward's steps: 0 is the loss, ``n - w``
the backward of wave ``w`` of ``n``. The parts of a holder set are sorted by their *group
tick* (the latest ready tick over the holders), and cut into buckets that close when the group
tick changes (unless the bucket is still small) or when the buffer would pass a size cap. A
bucket is ready on a rank at the latest ready tick of its parts there, and every holder of a set
issues the set's buckets in the same order (the order they were cut in): that is what lets the
holders issue them asynchronously, each as soon as its own backward allows, without their
collectives crossing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .parts import Part
from .schedule import shard_bounds

# A bucket's buffer is a transient copy of its gradients: 16 MiB in fp32 at most (DDP's default
# is 25 MB), small enough to overlap the first buckets with the rest of the backward.
MAX_BUCKET_ELEMENTS = 1 << 22
# A bucket below this size stays open across ticks: one more small collective costs more
# (its fixed latency) than waiting a wave for the next parts.
MIN_BUCKET_ELEMENTS = 1 << 16


def least_bucket_elements(cores_shared: bool, cap: int = MAX_BUCKET_ELEMENTS) -> int:
    """The size below which a bucket stays open across ticks. Where a node's ranks outnumber
    its cores, every core is busy with some rank's compute, so a collective issued early
    overlaps nothing and only adds its latency (and a context switch per ring step): the
    buckets then fill to the cap, as few collectives as the cap allows. Elsewhere a bucket
    closes with its tick once it holds ``MIN_BUCKET_ELEMENTS``, overlapping the rest of the
    backward."""
    return cap if cores_shared else MIN_BUCKET_ELEMENTS


@dataclass(frozen=True)
class PartShard:
    """One part's place in its bucket."""

    part: Part
    numel: int  # trainable elements of the part
    holders: tuple[int, ...]
    offset: int  # start of the part's slot in each row of the bucket's buffer

    @property
    def slot(self) -> int:
        """S: the longest shard, and the slot each row keeps for the part."""
        return -(-self.numel // len(self.holders))

    def bounds(self, rank: int) -> tuple[int, int]:
        """``[lo, hi)`` of the flattened part that ``rank`` owns (possibly empty)."""
        return shard_bounds(self.numel, len(self.holders))[self.holders.index(rank)]


@dataclass(frozen=True)
class Bucket:
    """Parts with the same holders that are reduced and gathered together."""

    holders: tuple[int, ...]
    parts: tuple[PartShard, ...]
    ready: tuple[int, ...] = ()  # per holder (holders' order): tick after which it may issue

    @property
    def chunk(self) -> int:
        """Elements in one row of the buffer: the sum of the parts' slots."""
        return sum(p.slot for p in self.parts)

    @property
    def numel(self) -> int:
        """Trainable elements of the bucket's parts (without the padding of the slots)."""
        return sum(p.numel for p in self.parts)

    def ready_on(self, rank: int) -> int:
        """The backward tick after which ``rank`` has every gradient of the bucket (0 when the
        bucket was planned without ticks)."""
        return self.ready[self.holders.index(rank)] if self.ready else 0


def plan_buckets(
    held: Iterable[tuple[Part, tuple[int, ...], int]],
    max_elements: int = MAX_BUCKET_ELEMENTS,
    ready: Mapping[Part, tuple[int, ...]] | None = None,
    min_elements: int = MIN_BUCKET_ELEMENTS,
) -> tuple[Bucket, ...]:
    """Buckets of (part, holders, trainable elements), given in the schedule's global part
    order; parts without trainable elements are left out. ``ready[part]`` gives the part's
    ready tick on each of its holders (none: every part is ready at tick 0).

    The result for a holder set depends only on that set's parts, their order and their ticks,
    so every holder of a set computes the same buckets in the same order. A bucket closes when
    its buffer (``k`` rows) would pass ``max_elements``, or when the group tick changes and it
    holds ``min_elements`` already; a part larger than the cap gets a bucket of its own. The
    buckets come sorted by group tick, then the later parts first (the backward's order)."""
    by_holders: dict[tuple[int, ...], list[tuple[int, int, Part, int]]] = {}
    for position, (part, holders, numel) in enumerate(held):
        if numel <= 0:
            continue
        ticks = ready[part] if ready is not None else (0,) * len(holders)
        # within a tick, later parts first: the backward finishes them first, so a bucket can
        # be issued while the stage's backward still runs (``grads.GradSync``'s hooks)
        by_holders.setdefault(holders, []).append((max(ticks), -position, part, numel))
    done: list[tuple[int, int, Bucket]] = []
    for holders, parts in by_holders.items():
        k = len(holders)
        current: list[tuple[int, int, Part, int]] = []

        def close(current=current, holders=holders) -> None:
            placed, used = [], 0
            for _, _, part, numel in current:
                shard = PartShard(part, numel, holders, used)
                placed.append(shard)
                used += shard.slot
            ticks = tuple(
                max(ready[p][i] for _, _, p, _ in current) if ready is not None else 0
                for i in range(len(holders))
            )
            bucket = Bucket(holders, tuple(placed), ticks)
            done.append((max(t for t, _, _, _ in current), current[0][1], bucket))
            current.clear()

        for item in sorted(parts):
            tick, _, _, numel = item
            if current:
                used = sum(-(-n // k) for _, _, _, n in current)
                full = (used + -(-numel // k)) * k > max_elements
                moved = tick != current[-1][0] and used * k >= min_elements
                if full or moved:
                    close()
            current.append(item)
        if current:
            close()
    return tuple(b for _, _, b in sorted(done, key=lambda x: (x[0], x[1])))
