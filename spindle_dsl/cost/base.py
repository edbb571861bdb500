"""What the planner asks of a cost model, and the curves it gets back.

The planner sees MetaOps and curves, never kinds or profiles: a ``Curve`` is T_m(n), the
forward+backward seconds of one layer of MetaOp m on n devices, for every n the planner may
allocate. A ``CostModel`` also prices memory and communication so that the planner can check a
placement fits and count transfers and gradient synchronisation in the iteration time. Both the
analytic model and the profile-fitted one implement this protocol.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from spindle_dsl.cluster import Cluster
from spindle_dsl.metagraph import MetaGraph, MetaOp


@dataclass(frozen=True)
class Curve:
    """T_m(n) for one MetaOp: ``seconds[i]`` is one layer's time on ``ns[i]`` devices."""

    metaop: str
    ns: tuple[int, ...]  # valid allocations, increasing
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        assert len(self.ns) == len(self.seconds) > 0, f"{self.metaop}: empty or ragged curve"
        assert list(self.ns) == sorted(set(self.ns)), f"{self.metaop}: ns must increase"
        assert all(s > 0 for s in self.seconds), f"{self.metaop}: times must be positive"

    @cached_property
    def _by_n(self) -> dict[int, float]:
        return dict(zip(self.ns, self.seconds, strict=True))

    def at(self, n: int) -> float:
        """T_m(n); KeyError if n is not a valid allocation."""
        return self._by_n[n]

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


class CostModel(Protocol):
    """Prices compute, memory and communication for one MetaGraph on one cluster."""

    def curves(self, graph: MetaGraph) -> Curves:
        """T_m(n) for every MetaOp and every valid n from 1 to the cluster size."""
        ...

    def memory_bytes(self, op: MetaOp, n: int, layers: int) -> int:
        """Peak bytes per device to train ``layers`` layers of ``op`` on ``n`` devices:
        parameters, gradients, optimizer state and the activations kept for backward."""
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
