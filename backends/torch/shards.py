"""Where each holder's shard of a part's optimizer state lies (the ZeRO-1 layout), in plain Python.

A part's trainable parameters, flattened in module order, form one vector of ``numel``
elements; its ``k`` holders split it into the contiguous ceil-split shards the batch uses
(``shard_bounds``): holder ``i`` owns ``[i*S, (i+1)*S)`` clipped to ``numel``, ``S = ceil(numel /
k)``, so the last shards may be short or empty. Keeping the split per part is what lets a
checkpoint stay per part: a part's state is reassembled from its own holders alone, and any
other plan re-splits it over its own holders.

Parts with the same holders travel together in a bucket, so a step issues one reduce-scatter and
one all-gather per bucket, not per part. A bucket's communication buffer is ``k`` rows (one per
holder) of ``chunk`` elements: row ``i`` is holder ``i``'s shard of every part of the bucket, each
in a slot of ``S`` elements at the part's ``offset`` (slots are padded to ``S`` so every row has
the same length, which reduce-scatter and all-gather need). A bucket is capped in size, because
its buffer is a transient copy of its gradients.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .parts import Part
from .schedule import shard_bounds

MAX_BUCKET_ELEMENTS = 1 << 25  # 128 MiB of fp32 gradients in flight per bucket


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

    @property
    def chunk(self) -> int:
        """Elements in one row of the buffer: the sum of the parts' slots."""
        return sum(p.slot for p in self.parts)


def plan_buckets(
    held: Iterable[tuple[Part, tuple[int, ...], int]],
    max_elements: int = MAX_BUCKET_ELEMENTS,
) -> tuple[Bucket, ...]:
    """Buckets of (part, holders, trainable elements), given in the schedule's global part
    order; parts without trainable elements are left out.

    The result depends only on the parts of each holder set and their order, so every holder of
    a set computes the same buckets, and every rank meets its buckets in an order that agrees
    with every other rank's (a bucket comes where its first part comes in the global order):
    their collectives cannot cross. A bucket closes when its buffer (``k`` rows) would pass
    ``max_elements``; a part larger than that gets a bucket of its own."""
    open_: dict[tuple[int, ...], list[PartShard]] = {}
    done: list[tuple[int, Bucket]] = []
    first_at: dict[tuple[int, ...], int] = {}
    for position, (part, holders, numel) in enumerate(held):
        if numel <= 0:
            continue
        k = len(holders)
        parts = open_.get(holders, [])
        slot = -(-numel // k)
        used = sum(p.slot for p in parts)
        if parts and (used + slot) * k > max_elements:
            done.append((first_at[holders], Bucket(holders, tuple(parts))))
            parts, used = [], 0
        if not parts:
            first_at[holders] = position
        parts.append(PartShard(part, numel, holders, used))
        open_[holders] = parts
    for holders, parts in open_.items():
        if parts:
            done.append((first_at[holders], Bucket(holders, tuple(parts))))
    return tuple(b for _, b in sorted(done, key=lambda x: x[0]))
