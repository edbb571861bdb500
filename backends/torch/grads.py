"""Gradient reduction inside each parameter device group.

A part's gradient is accumulated locally over every task and MetaOp a rank ran with it (autograd
adds into ``.grad``), and then summed over the ranks that hold the part: its parameter device
group. Parts with the same holders travel together as one flat buffer, so a step issues one
all-reduce per distinct group instead of one per tensor. Every holder then has the same summed
gradient and takes the same optimizer step, so their copies stay identical without a broadcast.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .params import PartStore
from .schedule import Schedule


class GradReducer:
    """All-reduces gradients part group by part group."""

    def __init__(self, schedule: Schedule, rank: int, store: PartStore):
        self.store = store
        sets = sorted({ranks for _, ranks in schedule.holders if len(ranks) > 1})
        self.groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for ranks in sets:  # every rank creates every group, in the same order
            group = dist.new_group(list(ranks))
            if rank in ranks:
                self.groups[ranks] = group
        holders = schedule.holder_map
        self.buckets: list[tuple[tuple[int, ...], list[torch.nn.Parameter]]] = []
        for ranks in self.groups:
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
