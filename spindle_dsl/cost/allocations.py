"""Which allocations a curve is evaluated at: the ones that matter, never every n in 1..N.

A layer's time on n devices depends on n only through the configuration that runs it: how
many data-parallel replicas (``dp``) of how many tensor-parallel shards (``tp``), with any
devices beyond ``dp * tp`` idle. For a given ``tp``, the time depends on ``dp`` through the
largest shard of the batch, ``ceil(batch / dp)``, and through the gradient all-reduce over
``dp`` replicas, which only grows with ``dp``. So among all the ``dp`` that give one shard size,
the smallest is the fastest, and the only ``dp`` worth pricing are the *shard breakpoints*,
where ``ceil(batch / dp)`` drops: about ``2 * sqrt(batch)`` of them, whatever N is. T(n), the
fastest configuration using at most n devices, is then a step function known exactly for every
n from those few prices (``StepCurve``).

The planner still needs a list of allocations it may use (``Curve.ns``). It gets:

- every n up to ``DENSE`` (small clusters are planned exactly as if every n were listed);
- the steps of T(n) beyond that, thinned so that each kept step is at least ``STEP`` faster
  than the one kept before it (a batch of millions has thousands of tiny steps), and always
  the fastest one;
- the allocations placement and memory care about even where T(n) is flat: powers of two,
  divisors of N, whole nodes (powers of two and divisors of the node count), and N itself.
  More devices for the same time still shard the optimizer state further.

That is a few hundred allocations at most for any N up to the language's limit, so planning
does not grow with N; algorithms that need T(n) between listed points interpolate (the
allocator's continuous inverse does).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, TypeVar

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost.base import Curve

DENSE = 64  # every allocation up to this many devices is listed
STEP = 1 / 32  # beyond DENSE, a step of T(n) is listed if this much faster than the last listed

T = TypeVar("T")


def shard_breakpoints(batch: int, limit: int) -> tuple[int, ...]:
    """The data-parallel degrees ``dp <= limit`` at which the largest shard ``ceil(batch /
    dp)`` shrinks: the smallest ``dp`` for each shard size (1 is always first).

    Walks the shard sizes downwards: for shard ``s``, the least ``dp`` with ``ceil(batch /
    dp) <= s`` is ``ceil(batch / s)``, so the walk takes O(sqrt(batch)) steps.
    """
    limit = min(limit, max(batch, 1))
    out = [1]
    dp = 1
    while dp < limit:
        shard = -(-batch // dp)
        if shard <= 1:
            break
        dp = -(-batch // (shard - 1))  # the least dp whose shard is smaller
        if dp <= limit:
            out.append(dp)
        else:
            break
    return tuple(out)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@lru_cache(maxsize=256)
def cluster_grid(devices: int, per_node: int) -> tuple[int, ...]:
    """Allocations worth listing on any curve of this cluster (see the module docstring)."""
    per_node = max(1, min(per_node, devices))
    out = set(range(1, min(devices, DENSE) + 1))
    out.update(1 << k for k in range(devices.bit_length()) if (1 << k) <= devices)
    out.update(_divisors(devices))
    nodes = devices // per_node
    node_counts = {1 << k for k in range(nodes.bit_length()) if (1 << k) <= nodes}
    node_counts.update(_divisors(nodes) if nodes else ())
    out.update(k * per_node for k in node_counts if k >= 1)
    out.add(devices)
    return tuple(sorted(n for n in out if 1 <= n <= devices))


@dataclass(frozen=True)
class StepCurve(Generic[T]):
    """T(n) for every n: the fastest priced option that uses at most n devices.

    ``ns`` are the steps (each strictly faster than every option using fewer devices),
    ``seconds`` their times and ``options`` what each step runs (a configuration).
    """

    ns: tuple[int, ...]
    seconds: tuple[float, ...]
    options: tuple[T, ...]

    @classmethod
    def of(cls, priced: Iterable[tuple[int, float, T]], least: int = 1) -> StepCurve[T]:
        """From ``(devices used, seconds, option)``; ties go to fewer devices, then to the
        option listed first. An option using ``least`` devices, the fewest any uses, must be
        among them (one device, unless the options all need more)."""
        ordered = sorted(enumerate(priced), key=lambda e: (e[1][0], e[1][1], e[0]))
        ns: list[int] = []
        secs: list[float] = []
        opts: list[T] = []
        for _, (used, seconds, option) in ordered:
            if not secs or seconds < secs[-1]:
                if ns and ns[-1] == used:  # cannot happen after the sort; kept for clarity
                    continue
                ns.append(used)
                secs.append(seconds)
                opts.append(option)
        assert ns and ns[0] == least, f"a step curve needs an option on {least} device(s)"
        return cls(tuple(ns), tuple(secs), tuple(opts))

    def index(self, n: int) -> int:
        """Position of the step that serves ``n`` devices."""
        return bisect.bisect_right(self.ns, n) - 1

    def at(self, n: int) -> tuple[float, T]:
        """(seconds, option) on ``n >= 1`` devices."""
        i = self.index(n)
        return self.seconds[i], self.options[i]

    def listed(self, grid: Sequence[int], devices: int) -> tuple[int, ...]:
        """The allocations a curve lists (module docstring): ``grid``, every step up to
        ``DENSE``, the thinned steps beyond it and the fastest step, all at most
        ``devices``."""
        keep = {n for n in grid if n <= devices}
        last = None
        for n, s in zip(self.ns, self.seconds, strict=True):
            if n > devices:
                break
            if n <= DENSE or last is None or s <= last * (1 - STEP):
                keep.add(n)
                last = s
        top = self.index(devices)
        keep.add(self.ns[top])
        return tuple(sorted(keep))


@dataclass(frozen=True)
class ForcedCurve(Generic[T]):
    """T(n) when every entry on at least ``from_n`` devices must run one kind of layout
    (``spindle plan --tp K``): ``below``'s options under ``from_n`` devices, ``above``'s
    from there. Unlike a ``StepCurve`` it may rise at ``from_n``: the forced layout can be
    slower than the best one on fewer devices, and the planner then weighs that."""

    below: StepCurve[T]
    above: StepCurve[T]
    from_n: int

    def at(self, n: int) -> tuple[float, T]:
        return (self.below if n < self.from_n else self.above).at(n)

    def listed(self, grid: Sequence[int], devices: int) -> tuple[int, ...]:
        low = self.below.listed(grid, min(devices, self.from_n - 1))
        high = [n for n in self.above.listed(grid, devices) if n >= self.from_n]
        return tuple(sorted({*low, *high}))


def listed(step: StepCurve[T] | ForcedCurve[T], cluster: Cluster) -> tuple[int, ...]:
    """The allocations a curve of ``cluster`` lists for this step curve."""
    return step.listed(cluster_grid(cluster.devices, cluster.devices_per_node), cluster.devices)


def curve_of(
    metaop: str,
    step: StepCurve[T] | ForcedCurve[T],
    cluster: Cluster,
    layout: Callable[[T], tuple[int, int] | None] | None = None,
) -> Curve:
    """The ``Curve`` a cost model hands the planner: T(n) at the listed allocations, with the
    (dp, tp) of each point where ``layout`` names one that is not plain data parallel."""
    ns = listed(step, cluster)
    points = [step.at(n) for n in ns]
    layouts: tuple[tuple[int, int], ...] = ()
    if layout is not None:
        named = [layout(option) for _, option in points]
        if any(lay is not None for lay in named):
            layouts = tuple(lay or (n, 1) for n, lay in zip(ns, named, strict=True))
    return Curve(metaop, ns, tuple(s for s, _ in points), layouts)
