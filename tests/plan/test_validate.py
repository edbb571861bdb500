"""validate_plan: a good plan passes; each broken invariant is named."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spindle_dsl.plan.model import (
    ClusterRef,
    Entry,
    Plan,
    PlanMetaOp,
    SolverInfo,
    SpecRef,
    Wave,
)
from spindle_dsl.plan.validate import validate_plan


def op(op_id: str, layers: int, deps=()) -> PlanMetaOp:
    return PlanMetaOp(
        id=op_id,
        task=op_id.split("/")[0],
        module=op_id.split("/")[1],
        kind="transformer",
        layers=layers,
        batch=8,
        tokens=16,
        deps=tuple(deps),
        forward_flops_per_layer=1e9,
        param_bytes_per_layer=1000,
        seconds_per_layer=((1, 1.0), (2, 0.5), (4, 0.25)),
    )


@pytest.fixture
def plan() -> Plan:
    waves = (
        Wave(0, 0.0, 1.0, (Entry("t/a", 0, 2, (0, 1), 1.0), Entry("u/c", 0, 1, (2,), 1.0))),
        Wave(1, 1.0, 0.5, (Entry("t/a", 2, 4, (0, 1, 2, 3), 0.5),)),
        Wave(2, 1.5, 0.75, (Entry("t/b", 0, 3, (0, 1, 2, 3), 0.75),)),
    )
    return Plan(
        spec=SpecRef("x.spindle", "0" * 64, None),
        cluster=ClusterRef(4, "A100-80GB", 4, 80 * 2**30),
        metaops=(op("t/a", 4), op("t/b", 3, ["t/a"]), op("u/c", 1)),
        waves=waves,
        iteration_s=2.5,
        lower_bound_s=1.5,
        baselines=(("sequential_s", 3.0),),
        solver=SolverInfo("test", "heuristic", 0.01),
        breakdown=(("compute_s", 2.25), ("transfer_s", 0.25)),
        memory_bytes=(1, 2, 3, 4),
    )


def with_wave(plan: Plan, i: int, **changes) -> Plan:
    waves = list(plan.waves)
    waves[i] = replace(waves[i], **changes)
    return replace(plan, waves=tuple(waves))


def test_good_plan_is_valid(plan):
    assert validate_plan(plan) == []


def test_coverage_gap_and_overlap(plan):
    bad = with_wave(plan, 1, entries=(Entry("t/a", 3, 4, (0, 1, 2, 3), 0.25),))
    errs = validate_plan(bad)
    assert any("coverage" in e and "'t/a'" in e for e in errs)
    bad = with_wave(plan, 1, entries=())
    assert any("covers layers up to 2 of 4" in e for e in validate_plan(bad))


def test_two_entries_of_one_metaop_in_a_wave(plan):
    bad = with_wave(
        plan,
        0,
        entries=(Entry("t/a", 0, 1, (0,), 1.0), Entry("t/a", 1, 2, (1,), 1.0)),
    )
    assert any("two entries" in e for e in validate_plan(bad))


def test_dependency_in_the_same_wave(plan):
    waves = (
        plan.waves[0],
        Wave(1, 1.0, 0.75, (Entry("t/a", 2, 4, (0, 1), 1.0), Entry("t/b", 0, 3, (2, 3), 1.5))),
    )
    bad = replace(plan, waves=waves)
    assert any(e.startswith("dependencies") for e in validate_plan(bad))


def test_devices_shared_or_out_of_range(plan):
    bad = with_wave(
        plan, 0, entries=(Entry("t/a", 0, 2, (0, 1), 1.0), Entry("u/c", 0, 1, (1,), 1.0))
    )
    assert any("device 1 runs both" in e for e in validate_plan(bad))
    bad = with_wave(plan, 2, entries=(Entry("t/b", 0, 3, (1, 2, 3, 7), 0.75),))
    assert any("outside [0, 4)" in e for e in validate_plan(bad))


def test_times(plan):
    bad = with_wave(plan, 2, entries=(Entry("t/b", 0, 3, (0, 1, 2, 3), 0.5),))
    assert any("expected 0.75 s" in e for e in validate_plan(bad))
    bad = with_wave(plan, 2, entries=(Entry("t/b", 0, 3, (0, 1, 2), 1.0),))
    assert any("no seconds_per_layer for 3" in e for e in validate_plan(bad))
    bad = with_wave(plan, 1, start_s=1.2)
    assert any("starts at" in e for e in validate_plan(bad))
    bad = with_wave(plan, 0, duration_s=0.5)
    assert any("shorter than its entry" in e for e in validate_plan(bad))
    assert any("less than the waves" in e for e in validate_plan(replace(plan, iteration_s=2.0)))


def test_bounds(plan):
    assert any("lower_bound_s" in e for e in validate_plan(replace(plan, lower_bound_s=9.0)))
    slow = replace(plan, baselines=(("sequential_s", 2.4),))
    assert any("no note says why" in e for e in validate_plan(slow))
    assert validate_plan(replace(slow, notes=("slower than sequential: asked for",))) == []
    assert any("lack 'sequential_s'" in e for e in validate_plan(replace(plan, baselines=())))


def test_memory_and_breakdown(plan):
    assert any("3 figures" in e for e in validate_plan(replace(plan, memory_bytes=(1, 2, 3))))
    over = replace(plan, memory_bytes=(1, 2, 3, 81 * 2**30))
    assert any("1 device(s)" in e and "device 3 with 81.0 GiB" in e for e in validate_plan(over))
    bad = replace(plan, breakdown=(("compute_s", 2.0),))
    assert any("not the waves' sum" in e for e in validate_plan(bad))


def test_unknown_metaops(plan):
    bad = replace(plan, metaops=(*plan.metaops, op("v/d", 1, ["nope"])))
    errs = validate_plan(bad)
    assert any("unknown MetaOp 'nope'" in e for e in errs)
    assert any("'v/d' covers layers up to 0" in e for e in errs)


def test_micro_batches(plan):
    """k passes of the waves: iteration_s and compute_s cover all of them."""
    twice = replace(plan, micro_batches=2)
    assert any("times micro_batches (2)" in e for e in validate_plan(twice))
    waves = sum(w.duration_s for w in plan.waves)
    fixed = replace(
        twice,
        iteration_s=2 * plan.iteration_s,
        breakdown=(("compute_s", 2 * waves),),
        baselines=(("sequential_s", 2 * plan.iteration_s),),
    )
    assert validate_plan(fixed) == []


def test_busy_and_idle_split_the_waves_time(plan):
    # device-seconds: wave 0 holds 2 x 1.0 + 1 x 1.0, wave 1 4 x 0.5, wave 2 4 x 0.75: 8.0
    # on 4 devices, 2.0 s busy of the waves' 2.25 s
    assert plan.compute_s() == pytest.approx(2.25)
    assert plan.busy_s() == pytest.approx(2.0)
    assert plan.idle_share() == pytest.approx(1 - 2.0 / 2.25)
    twice = replace(plan, micro_batches=2)  # every pass runs the waves again
    assert (twice.compute_s(), twice.busy_s()) == pytest.approx((4.5, 4.0))
    assert twice.idle_share() == pytest.approx(plan.idle_share())


def test_over_lp_needs_an_lp_figure(plan):
    assert plan.over_lp() is None  # a plan from before the LP bound
    lp = replace(plan, extra={"bounds": {"lp_s": 1.5}})
    assert lp.over_lp() == pytest.approx((2.25 / 1.5, 2.0 / 1.5))
    assert replace(lp, waves=()).over_lp() is None
