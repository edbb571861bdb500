"""What one planning call may run: the ``milp`` scheduler's passes, and its time.

The ``milp`` scheduler (``milp_scheduler``) chains several passes, each kept only where it
improves the plan. ``bench/plan_quality.py --ablation`` plans with each switched off in turn
and prints the iteration and planning time, so that a pass that does not pay can be seen
(and dropped). Planning uses ``ALL_PASSES`` unless a caller asks otherwise; the switches
are for measurement, not a user-facing option.

A ``Budget`` is the whole call's time (``--time-limit``): the search's optional steps start
only while their share of it is unspent (``search.make``, ``search.leversearch``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Budget:
    """The seconds one planning call may take, from ``start`` (``time.perf_counter``).

    What a plan needs runs whatever the clock says (the first setting of the levers that
    fits, one round at it, the lower bound); each step that only may improve the plan or its
    report asks ``within(share)`` first, the shares growing along the search, so that the
    steps that pay most come first and the call ends near ``seconds`` at any size."""

    start: float
    seconds: float

    @classmethod
    def starting_now(cls, seconds: float) -> Budget:
        return cls(time.perf_counter(), seconds)

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return max(0.0, self.seconds - self.spent())

    def within(self, share: float) -> bool:
        """Whether less than ``share`` of the budget is spent: a step may start."""
        return self.spent() < share * self.seconds


UNLIMITED = Budget(0.0, math.inf)


@dataclass(frozen=True)
class PassOptions:
    """Which passes run (all by default).

    ``level_milps``: per-MetaLevel MILPs for the first start (off: the paper's waves for
    each level).
    ``cross_starts``: the starts besides the waves level by level: three that ignore
    MetaLevels (CPA list scheduling, the task-parallel chains, the tasks side by side with
    their branches side by side) and the levels packed with short MetaOps in turn on shared
    devices (off: only the level-by-level start and the paper's plan).
    ``global_milp``: one MILP over all waves with precedence, warm-started from the best
    start (``improve.wave_milp``).
    ``resplit``: the LP/MILP re-split of layers between a schedule's pieces (in ``improve``
    and after a polish edit that dissolves a wave).
    ``polish``: local search on the placed plan's iteration time.
    ``refill``: after polish, each wave's allocations re-picked min-max (``rebalance``), a
    wave's change kept where the placed plan gets quicker.
    ``on_cores``: where CPU workers share fewer cores, the stages run on as many workers as
    cores too, each run at half the time, and the better placed plan is kept (off: every
    worker only; GPU plans never run it).
    ``match_cuts``: after placement, on every candidate of a round: the renamings of devices
    at wave boundaries that put pieces where their inputs are, in the search over renamings
    that weighs them against the loss phase's (``planner.evaluate.relabel``,
    ``planner.evaluate.relabel``; off: the loss phase's renamings alone).
    """

    level_milps: bool = True
    cross_starts: bool = True
    global_milp: bool = True
    resplit: bool = True
    polish: bool = True
    refill: bool = True
    on_cores: bool = True
    match_cuts: bool = True

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def without(self, name: str) -> PassOptions:
        """These options with pass ``name`` switched off."""
        if name not in self.names():
            raise ValueError(f"unknown pass '{name}' (choose from {', '.join(self.names())})")
        return replace(self, **{name: False})


ALL_PASSES = PassOptions()
NO_PASSES = PassOptions(**dict.fromkeys(PassOptions.names(), False))

__all__ = ["ALL_PASSES", "NO_PASSES", "UNLIMITED", "Budget", "PassOptions"]
