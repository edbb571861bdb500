"""What the planner asks of a cost model, and the curves it gets back.

The planner sees MetaOps and curves, never kinds or profiles: a ``Curve`` is T_m(n), the
forward+backward seconds of one layer of MetaOp m on n devices, for every n the planner may
allocate. A ``CostModel`` also prices memory and communication so that the planner can check a
placement fits and count transfers and gradient synchronisation in the iteration time. Both the
analytic model and the profile-fitted one implement this protocol.

Memory comes in two grades. ``memory_bytes`` prices a slice on its own, as one number. A
cost model that also offers ``slice_memory`` (``SliceMemoryModel``; both built-in models do)
says how the bytes add up across slices, which the planner needs to price what real training
systems do: parameter *parts* (a layer, an input stage, an LM head: the runtime's unit of
ownership) count once per device however many MetaOps of a shared module run them there, and
their optimizer state is sharded over every device that holds the part (ZeRO-1, Megatron's
distributed optimizer); activations kept for backward add up over the slices a device runs;
a slice's working set is transient, so only the largest counts. Such a model can also price
activation recompute (``curves(graph, recompute=...)``), which the planner turns on per
MetaOp when a plan does not fit otherwise. A model without ``slice_memory`` is planned with
``memory_bytes`` summed per piece and never recomputes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, TypeVar

import numpy as np

from spindle_dsl.cluster import Cluster
from spindle_dsl.metagraph import MetaGraph, MetaOp

# a byte count: Python numbers (exact integers stay exact) or numpy arrays (one per device)
Num = TypeVar("Num", int, float, np.ndarray)


def _least(a: Num, b: Num) -> Num:
    return np.minimum(a, b) if isinstance(a, np.ndarray) else min(a, b)


def _most(a: Num, b: Num) -> Num:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)


@dataclass(frozen=True)
class Curve:
    """T_m(n) for one MetaOp: ``seconds[i]`` is one layer's time on ``ns[i]`` devices."""

    metaop: str
    ns: tuple[int, ...]  # valid allocations, increasing
    seconds: tuple[float, ...]
    # (dp, tp) behind each point, aligned with ``ns``; empty: data parallel over all n devices
    layouts: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        assert len(self.ns) == len(self.seconds) > 0, f"{self.metaop}: empty or ragged curve"
        assert not self.layouts or len(self.layouts) == len(self.ns), f"{self.metaop}: layouts"
        assert list(self.ns) == sorted(set(self.ns)), f"{self.metaop}: ns must increase"
        assert all(s > 0 for s in self.seconds), f"{self.metaop}: times must be positive"

    @cached_property
    def _by_n(self) -> dict[int, float]:
        return dict(zip(self.ns, self.seconds, strict=True))

    def at(self, n: int) -> float:
        """T_m(n); KeyError if n is not a valid allocation."""
        return self._by_n[n]

    def layout(self, n: int) -> tuple[int, int]:
        """(dp, tp) the point at ``n`` is priced with: ``dp`` replicas of ``tp``-way layers."""
        if not self.layouts:
            return (n, 1)
        return dict(zip(self.ns, self.layouts, strict=True)).get(n, (n, 1))

    def lists(self, n: int) -> bool:
        """Whether ``n`` is one of the allocations this curve lists."""
        return n in self._by_n

    def items(self) -> Iterator[tuple[int, float]]:
        return iter(zip(self.ns, self.seconds, strict=True))


@dataclass(frozen=True)
class Curves:
    """One curve per MetaOp of a graph."""

    curves: tuple[Curve, ...]
    source: str  # "analytic" or the profile file they were fitted from

    @cached_property
    def _by_id(self) -> dict[str, Curve]:
        return {c.metaop: c for c in self.curves}

    def __getitem__(self, metaop_id: str) -> Curve:
        return self._by_id[metaop_id]

    def __iter__(self) -> Iterator[Curve]:
        return iter(self.curves)


def _share(total: int, count: int, n: int) -> int:
    """A run's bytes one of ``n`` holders pays when each of its ``count`` layers' ``total /
    count`` bytes is split over the n devices, rounded up per layer."""
    return count * -(-(total // count) // max(n, 1))


@dataclass(frozen=True)
class PartBytes:
    """One parameter part a slice holds, as one device of the slice pays for it; or a run of
    identical layer parts (``layers`` set), priced as one so that nothing counts layers.

    A run's figures are for the whole run (per layer times ``count``); the runtime still
    owns, reduces and shards each layer on its own, so a run's optimizer share on n devices
    is ``count * ceil(per-layer sharded / n)`` (``on``).

    The gradient is apart from the rest because it is not always alive: ``grads`` is this
    device's whole gradient, alive while it accumulates and until its bucket is reduced (when
    that is, by ZeRO stage and micro-batches, ``GradientLife`` says); ``grads_sharded`` the
    whole part's gradient that ZeRO-1 and ZeRO-2 reduce-scatter into a shard per holder
    (``grad_share``), kept until the update.
    """

    key: str  # "module/layer.J", "module/input.MODALITY" or "module/head" (as the runtime names
    # it); a run of layers [A, B) of a module is "module/layers.A-B"
    replicated: int  # on every device holding it, always: its weights (a tensor-parallel shard),
    # and under ZeRO stage 0 the whole optimizer state
    sharded: int  # optimizer state of the whole part, split evenly over every device holding it
    layers: tuple[int, int] | None = None  # a run: layers [A, B) of module ``key``'s prefix
    grads: int = 0  # this device's gradient of the part (a tensor-parallel shard; 0: frozen)
    grads_sharded: int = 0  # the whole part's gradient, reduce-scattered over its holders

    @property
    def count(self) -> int:
        """Layer parts in this run (1 for a single part)."""
        return 1 if self.layers is None else self.layers[1] - self.layers[0]

    @property
    def module(self) -> str:
        return self.key.rsplit("/", 1)[0]

    def on(self, n: int) -> int:
        """Bytes one of ``n`` devices holding it pays always: weights and its share of the
        optimizer state (each layer's state split over the n devices, rounded up)."""
        return self.replicated + _share(self.sharded, self.count, n)

    def grad_share(self, n: int) -> int:
        """This device's shard of the reduced gradient when ``n`` devices hold the part."""
        return _share(self.grads_sharded, self.count, n)


@dataclass(frozen=True)
class GradientLife:
    """When gradients are alive in a step, as the runtime runs one (``docs/runtime.md``), so
    that a device's peak is the larger of its two candidate moments (``peak``):

    * the end of the last pass's forward and the loss phase: parameters, optimizer state,
      every kept activation and the loss tensors; gradients only if they outlive a pass
      (``carried``: k > 1 under ZeRO stage 0 or 1, the accumulated whole gradients; under
      ZeRO-2 with k > 1 the reduced shards, ``shards_carried``);
    * the backward: activations are freed as gradients appear; at its end every whole
      gradient is alive under stage 0 (``whole_backward``, until the optimizer), under ZeRO-1
      and ZeRO-2 the reduced shards and at most a ``bucket`` in flight (a whole gradient is
      freed when its bucket's reduce-scatter is issued).
    """

    carried: bool = False
    shards_carried: bool = False
    whole_backward: bool = False
    bucket: int = 0  # bytes of one gradient bucket (the runtime's cap)

    def peak(self, forward: Num, grads: Num, shards: Num) -> Num:
        """The larger moment, given a device's kept activations and loss tensors
        (``forward``), its whole gradients (``grads``) and its gradient shards (``shards``):
        Python numbers (exact integers stay exact) or numpy arrays (per device)."""
        at_forward = forward
        if self.carried:
            at_forward = at_forward + grads
        if self.shards_carried:
            at_forward = at_forward + shards
        at_backward = grads if self.whole_backward else _least(grads, self.bucket) + shards
        return _most(at_forward, at_backward)


@dataclass(frozen=True)
class SliceMemory:
    """Bytes per device to run layers ``[first, end)`` of a MetaOp on ``n`` devices.

    The terms add up differently across the slices one device runs: ``parts`` count once per
    device (deduplicated by key), ``kept`` adds up (activations wait for the backward pass,
    which starts after every forward wave), and so does ``loss`` (the loss phase runs every
    loss of the device before it back-propagates them together, while every kept activation
    waits); ``working`` is transient (only a device's largest counts); the parts' gradients
    count when ``life`` says they are alive.
    """

    parts: tuple[PartBytes, ...]
    kept: int  # activations kept from forward until backward (recompute keeps layer inputs)
    working: int  # alive only while one layer (or the LM loss's logits) runs
    loss: int = 0  # an LM sink's log-probabilities and head inputs, alive in the loss phase
    life: GradientLife = GradientLife()

    def alone(self, n: int) -> int:
        """Peak bytes per device when this slice is all its ``n`` devices hold."""
        state = sum(p.on(n) for p in self.parts)
        grads = sum(p.grads for p in self.parts)
        shards = sum(p.grad_share(n) for p in self.parts)
        return state + int(self.life.peak(self.kept + self.loss, grads, shards)) + self.working


class CostModel(Protocol):
    """Prices compute, memory and communication for one MetaGraph on one cluster."""

    def curves(self, graph: MetaGraph) -> Curves:
        """T_m(n) for every MetaOp at the allocations that matter (``cost.allocations``):
        the planner allocates only the n a curve lists.

        A ``SliceMemoryModel`` also takes ``recompute``: the ids of MetaOps that recompute
        their activations, whose curves then include the extra forward pass."""
        ...

    def memory_bytes(self, op: MetaOp, n: int, layers: int) -> int:
        """Peak bytes per device to train ``layers`` layers of ``op`` on ``n`` devices with
        nothing else on them: parameters, gradients, optimizer state (sharded over the ``n``
        devices where the model shards it) and the activations kept for backward."""
        ...

    def transfer_seconds(
        self, nbytes: float, src: Sequence[int], dst: Sequence[int], cluster: Cluster
    ) -> float:
        """Time to move ``nbytes`` of activations (or their gradients) from the devices ``src``
        to the devices ``dst`` (0 when the groups are the same devices)."""
        ...

    def allreduce_seconds(self, nbytes: float, devices: Sequence[int], cluster: Cluster) -> float:
        """Time to all-reduce ``nbytes`` of gradients over ``devices`` (ring, intra vs inter)."""
        ...


class SliceMemoryModel(CostModel, Protocol):
    """A cost model that prices memory per parameter part and can price activation recompute
    (see the module docstring); the planner checks for ``slice_memory`` to use it."""

    def curves(self, graph: MetaGraph, recompute: frozenset[str] = frozenset()) -> Curves: ...

    def slice_memory(
        self,
        graph: MetaGraph,
        op: MetaOp,
        n: int,
        first: int,
        end: int,
        recompute: bool = False,
        zero_stage: int = 1,
        micro_batches: int = 1,
    ) -> SliceMemory:
        """Bytes per device to run layers ``[first, end)`` of ``op`` on ``n`` devices, with
        or without recomputing its activations in the backward pass, parameter state laid
        out for ZeRO stage ``zero_stage`` (0, 1 or 2: see ``cost.memory``) and gradients
        alive as ``micro_batches`` passes keep them (``graph`` carries one pass's batch)."""
        ...

    def alone_bytes(
        self,
        graph: MetaGraph,
        op: MetaOp,
        first: int,
        end: int,
        recompute: bool = False,
        ns: Sequence[int] | None = None,
        zero_stage: int = 1,
        micro_batches: int = 1,
    ) -> Sequence[int]:
        """``slice_memory(graph, op, n, first, end, recompute, zero_stage,
        micro_batches).alone(n)`` for every n of ``ns`` (default: the allocations ``op``'s
        curve lists), at once (the planner checks every allocation of every op)."""
        ...


def has_slice_memory(cost: object) -> bool:
    """Whether ``cost`` prices memory per part and activation recompute."""
    return callable(getattr(cost, "slice_memory", None))
