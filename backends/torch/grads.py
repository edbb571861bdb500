"""Gradient reduction inside each parameter device group, for the unsharded optimizer.

A part's gradient is accumulated locally over every task and MetaOp a rank ran with it (autograd
adds into ``.grad``), and then summed over the ranks that hold the part: its parameter device
group. Parts with the same holders travel together as one flat buffer, so a step issues one
all-reduce per distinct group instead of one per tensor. Every holder then has the same summed
gradient and takes the same optimizer step, so their copies stay identical without a broadcast.
(``zero.py`` is the sharded alternative: each holder steps only its shard, then they gather.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .params import PartStore
from .schedule import Schedule


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


class GradReducer:
    """All-reduces gradients part group by part group."""

    def __init__(
        self,
        schedule: Schedule,
        store: PartStore,
        groups: dict[tuple[int, ...], dist.ProcessGroup],
    ):
        self.store, self.groups = store, groups
        holders = schedule.holder_map
        self.buckets: list[tuple[tuple[int, ...], list[torch.nn.Parameter]]] = []
        for ranks in groups:
            params = [t for part, _, t in store.trainable() if holders[part] == ranks]
            if params:
                self.buckets.append((ranks, params))

    def reduce(self) -> None:
        """Sum every held trainable parameter's gradient over its holders, in place."""
        self.store.fill_missing_grads()
        for ranks, params in self.buckets:
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat, group=self.groups[ranks])
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p))
                offset += n
