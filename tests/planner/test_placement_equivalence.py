"""The vectorised placement chooses exactly the devices the per-device reference chooses."""

from __future__ import annotations

import random

import pytest

from spindle_dsl.cost.base import GradientLife, PartBytes, SliceMemory
from spindle_dsl.planner.evaluate import placement
from spindle_dsl.planner.evaluate.ledger import PartLedger
from spindle_dsl.planner.evaluate.placement import Topology, place
from spindle_dsl.planner.starts.baselines import BASELINES
from spindle_dsl.planner.starts.crosslevel import cpa_schedule
from spindle_dsl.planner.starts.wavefront import paper_schedule

from .placement_reference import place as reference_place
from .synth import random_problem


def _slices(problem, seed: int):
    """Slice memory with shared modules (ops of the same module index share parts)."""
    rng = random.Random(seed)
    act = {o.id: rng.randint(10, 400) for o in problem.ops}
    module = {o.id: f"m{rng.randint(0, 3)}" for o in problem.ops}

    # gradients alive through the forwards on some seeds (k > 1 under ZeRO-1), so the
    # ledger's peak of two moments steers the choices too
    life = GradientLife(carried=seed % 3 == 0, bucket=40)

    def slice_memory(op: str, n: int, first: int, end: int) -> SliceMemory:
        k = end - first
        run = PartBytes(
            f"{module[op]}/layers.{first}-{end}",
            50 * k // n,
            300 * k,
            (first, end),
            grads=50 * k // n,
            grads_sharded=50 * k,
        )
        return SliceMemory((run,), act[op] * k // n, act[op] // 3, act[op] // 5, life)

    partners = {
        o.id: tuple(p.id for p in problem.ops if p.id != o.id and module[p.id] == module[o.id])
        for o in problem.ops
    }
    return slice_memory, partners


@pytest.mark.parametrize("seed", range(16))
def test_same_devices_as_the_reference(seed, monkeypatch) -> None:
    rng = random.Random(seed)
    if seed % 2:  # the numpy path for many preferred devices, on small clusters
        monkeypatch.setattr(placement, "SMALL", 0)
    N = rng.choice([5, 12, 16, 24, 40, 100, 257])
    per_node = rng.choice([4, 8])
    problem = random_problem(rng, N, rng.randint(2, 7))
    slice_memory, partners = _slices(problem, seed)
    scheds = [paper_schedule(problem), cpa_schedule(problem)]
    scheds += [fn(problem) for fn in BASELINES.values()]
    for capacity in (10**9, 2000, 900, 300):  # roomy, tight, very tight (overflow fallback)
        weight = {o.id: rng.random() for o in problem.ops}
        topo = Topology(N, per_node, capacity, partners, weight)
        for sched in scheds:
            got = place(problem, sched, topo, PartLedger(N, slice_memory))
            want = reference_place(problem, sched, topo, PartLedger(N, slice_memory))
            assert got.waves == want.waves, (sched.name, capacity)
            assert got.memory == want.memory
            assert got.overflow == want.overflow
