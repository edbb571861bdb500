"""Measured peak memory of a rank: the tensor bytes a training step holds, not process RSS.

On CUDA the allocator knows: the peak is ``torch.cuda.max_memory_allocated`` of the rank's
device over the run (everything the caching allocator handed out: the terms below plus every
transient of a kernel, workspace and communication buffer).

On CPU there is no such statistic, so the meter accounts for the tensors the step holds, each
underlying storage once, and tracks the peak of their sum over the run:

- ``parameters``: every parameter of the parts the rank holds (trainable or frozen), always;
- ``gradients``: every parameter's ``.grad`` while it exists (from its first accumulation until
  the optimizer or, under ZeRO-2, the bucket's issue frees it), the unsharded optimizer's
  flat reduction buffers (the gradients become views of them), and the sharded optimizer's
  reduced gradient shards until its update;
- ``optimizer``: AdamW's ``exp_avg`` and ``exp_avg_sq`` (and fp32 master weights), whole or the
  rank's shards, from their allocation at the first step on;
- ``activations``: every tensor autograd saves for backward during the step
  (``saved_tensors_hooks``), from the save until the backward that uses it releases it,
  including the LM losses' log-probabilities and, for a recomputing MetaOp, each layer's input
  that the checkpoint keeps; plus each stage's output, kept from its forward until its
  backward, and the activations received from other ranks (kept until the gradients go back);
  a storage that is a parameter is counted as a parameter only;
- ``buffers``: communication buffers alive at the time: a sharded bucket's rows from its issue
  until its collective is done, the all-gather rows of the update, and the persistent receive
  buffers of the activation exchange.

The CPU meter watches the first ``WATCHED_STEPS`` steps of a run (``stop``): its hooks run
Python for every tensor autograd saves, a few percent of a small model's step, and from the
second step on every step holds the same tensors (the optimizer's state exists from the first
update), so the steps after add nothing to the peak but that cost.

Not counted on CPU: intermediates of a layer that autograd does not save (they are freed as
the layer runs), the gradients flowing between autograd nodes during the backward, the
activations a recomputing layer rebuilds inside its backward, the logits of a loss before
the log-softmax, data batches and the small scalars of the optimizer. So the CPU figure is what
the step keeps, as the planner's memory model counts it, and a CUDA figure may exceed it by
those transients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .params import PartStore

TERMS = ("parameters", "gradients", "optimizer", "activations", "buffers")
WATCHED_STEPS = 3  # steps the CPU meter watches: the first (state allocated), then steady ones


class _Token:
    """Releases its storage's count when the tensor (or saved slot) holding it goes away."""

    __slots__ = ("key", "meter")

    def __init__(self, meter: MemoryMeter, key: int):
        self.meter, self.key = meter, key

    def __del__(self) -> None:
        self.meter._release(self.key)


class _Saved:
    """What autograd keeps for a saved tensor while the meter watches: the tensor and its
    token (so the count drops when autograd drops the slot)."""

    __slots__ = ("tensor", "token")

    def __init__(self, tensor: torch.Tensor, token: _Token | None):
        self.tensor, self.token = tensor, token


class MemoryMeter:
    """The peak tensor bytes one rank holds (see the module docstring for what counts)."""

    def __init__(self, store: PartStore, device: torch.device, *, enabled: bool = True):
        self.enabled = enabled
        self.cuda = device.type == "cuda"
        self.watching = enabled and not self.cuda  # the CPU hooks count (until ``stop``)
        self.device = device
        self.live = dict.fromkeys(TERMS, 0)
        self.peak = 0
        self.at_peak: dict[str, int] = dict(self.live)
        # per stage (MetaOp, stage index): the most activation bytes its forward added and
        # kept for the backward (what autograd saved and the stage's output), over passes
        self.stage_kept: dict[str, int] = {}
        self._storages: dict[int, list[Any]] = {}  # data_ptr -> [references, bytes, term]
        self._param_ptrs: set[int] = set()
        self._hooks: list[Any] = []  # the gradient hooks, removed by ``stop``
        if not enabled:
            return
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
            return
        for t in store.parameters():
            storage = t.untyped_storage()
            if storage.data_ptr() not in self._param_ptrs and storage.nbytes():
                self._param_ptrs.add(storage.data_ptr())
                self.live["parameters"] += storage.nbytes()
        self._hooks = [
            t.register_post_accumulate_grad_hook(self._grad_hook) for _, _, t in store.trainable()
        ]
        self._sample()

    def stop(self) -> None:
        """Stop counting (the peak so far stands): every later step would hold what the
        watched ones held, and the hooks cost time (see the module docstring)."""
        if not self.watching:
            return
        self.watching = False
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # --- what the runtime tells it -------------------------------------------------------------
    def keep(self, tensor: torch.Tensor, term: str) -> None:
        """Count ``tensor``'s storage under ``term`` for as long as this tensor object lives
        (a storage already counted is not counted again)."""
        if not self.watching or hasattr(tensor, "_spindle_meter"):
            return
        key = self._acquire(tensor, term)
        if key is not None:
            tensor._spindle_meter = _Token(self, key)  # dies with the tensor

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Count what autograd saves for backward inside the block, until it is released."""
        if not self.watching:
            yield
            return
        with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
            yield

    def note_stage(self, key: str, before: int) -> None:
        """Record what a stage's forward kept: activations now less ``before`` (the count
        taken before it ran)."""
        if self.watching:
            added = self.live["activations"] - before
            self.stage_kept[key] = max(self.stage_kept.get(key, 0), added)

    # --- what it reports -----------------------------------------------------------------------
    def peak_bytes(self) -> int:
        if self.enabled and self.cuda:
            return int(torch.cuda.max_memory_allocated(self.device))
        return self.peak

    def peak_terms(self) -> dict[str, int]:
        """Bytes per term at the moment of the peak (empty on CUDA, where only the total is
        known)."""
        return {} if self.cuda else dict(self.at_peak)

    # --- inside --------------------------------------------------------------------------------
    def _pack(self, tensor: torch.Tensor) -> _Saved:
        key = self._acquire(tensor, "activations")
        return _Saved(tensor, _Token(self, key) if key is not None else None)

    def _grad_hook(self, param: torch.Tensor) -> None:
        if param.grad is not None:
            self.keep(param.grad, "gradients")

    def _acquire(self, tensor: torch.Tensor, term: str) -> int | None:
        storage = tensor.untyped_storage()
        ptr, size = storage.data_ptr(), storage.nbytes()
        if not size or ptr in self._param_ptrs:
            return None
        entry = self._storages.get(ptr)
        if entry is not None:
            entry[0] += 1
            return ptr
        self._storages[ptr] = [1, size, term]
        self.live[term] += size
        self._sample()
        return ptr

    def _release(self, ptr: int) -> None:
        entry = self._storages.get(ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] <= 0:
            del self._storages[ptr]
            self.live[entry[2]] -= entry[1]

    def _sample(self) -> None:
        total = sum(self.live.values())
        if total > self.peak:
            self.peak = total
            self.at_peak = dict(self.live)


def _unpack(saved: _Saved) -> torch.Tensor:
    return saved.tensor
