"""The planning call's one time budget (``--time-limit``): what a plan needs runs whatever the
clock says, the steps that only may improve it start while their share is unspent.

The memory-model spec (``tests/conftest.py``) with its device memory cut down, so that the
lever search has recompute to fit and baselines to tune."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from spindle_dsl.cli.cmd_plan import summary, summary_text
from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_text
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner import make_plan
from spindle_dsl.planner.evaluate.build import compute_floor, context
from spindle_dsl.planner.model.levers import UNLIMITED, Budget, Levers
from spindle_dsl.planner.search import leversearch
from spindle_dsl.planner.search import make as make_module
from spindle_dsl.planner.search.leversearch import Judge, LeverSearch
from spindle_dsl.planner.search.make import AS_PLACED_NOTE
from spindle_dsl.planner.search.rounds import plan_round
from spindle_dsl.planner.starts.wavefront import paper_schedule

from .test_memory_levers import with_memory


@pytest.fixture(scope="module")
def tight(memory_spec):
    """Fits at k = 1 only with recompute: the search has steps past its first fit."""
    return with_memory(compile_text(memory_spec(768)).graph, 300)


def _paper(_name, problem):
    return paper_schedule(problem)


def _spent(seconds: float = 1.0) -> Budget:
    """A budget whose time is all gone."""
    return Budget(time.perf_counter() - 2 * seconds, seconds)


def test_within_says_whether_a_share_is_unspent() -> None:
    now = Budget.starting_now(100.0)
    assert now.within(0.5) and now.left() > 99.0
    gone = _spent()
    assert not gone.within(0.99) and gone.left() == 0.0
    assert UNLIMITED.within(0.01) and UNLIMITED.left() == float("inf")


def test_a_spent_budget_stops_the_lever_search_at_its_first_fit(tight) -> None:
    judge = Judge(("paper",), lambda _name, problem: paper_schedule(problem))
    cost = make_cost_model(tight.cluster)
    full = LeverSearch(tight, cost)
    full_fit = full.search(judge)
    short = LeverSearch(tight, cost, budget=_spent())
    short_fit = short.search(judge)
    assert full_fit.best is not None and short_fit.best is not None
    assert short_fit.best.fitting is not None  # a setting that fits, whatever the clock
    assert len(short._contexts) < len(full._contexts)
    assert short_fit.best.time_s >= full_fit.best.time_s * (1 - 1e-9)


class _MemoryHeldJudge:
    """Judges a setting by two stand-in plans: a quick one that overflows below k = 4 and a
    slow one that always fits (the shape of 48 tasks on 1,024 devices, where only the tasks
    side by side fit at k = 1 and 2)."""

    names = ("quick", "slow")

    def __init__(self, quick_s: float, slow_s: float):
        self.quick_s, self.slow_s = quick_s, slow_s

    def __call__(self, ctx, names=None):
        k = ctx.levers.micro_batches
        return [
            SimpleNamespace(fits=k >= 4, iteration_s=self.quick_s * (1 + k / 100)),
            SimpleNamespace(fits=True, iteration_s=self.slow_s),
        ]


def test_out_of_time_the_search_goes_on_while_memory_holds_the_plan_back(tight) -> None:
    cost = make_cost_model(tight.cluster)
    held = LeverSearch(tight, cost, budget=_spent())
    fit = held.search(_MemoryHeldJudge(1.0, 3.0))  # the quick plan 3x quicker: more k
    assert fit.best is not None and fit.best.levers.micro_batches == 4
    assert fit.best.time_s == pytest.approx(1.04)
    near = LeverSearch(tight, cost, budget=_spent())
    fit = near.search(_MemoryHeldJudge(1.0, 1.1))  # within HELD_BACK: the first fit stands
    assert fit.best is not None and fit.best.levers.micro_batches == 1
    assert near.explored == [1]


def test_a_plan_out_of_time_still_fits_and_says_which_baselines_went_untuned(tight) -> None:
    cost = make_cost_model(tight.cluster)
    plan = make_plan(tight, cost, time_limit_s=1e-6, jobs=0)
    assert validate_plan(plan) == []
    (note,) = [n for n in plan.notes if n.startswith("time limit reached")]
    untuned = note.split(": ", 1)[1].split(" at ")[0].split(", ")
    assert set(untuned) == {"sequential", "distmm", "optimus"}
    # each still reported, at a setting the plan's search placed it at; the default
    # scheduler keeps the quickest, so none is quicker than the plan
    for name in untuned:
        assert plan.baseline(f"{name}_s") >= plan.iteration_s * (1 - 1e-9)


def test_a_budget_that_does_not_run_out_tunes_every_baseline(tight) -> None:
    cost = make_cost_model(tight.cluster)
    plan = make_plan(tight, cost, jobs=0)
    assert not [n for n in plan.notes if n.startswith(("time limit reached", AS_PLACED_NOTE))]
    assert set(plan.extra["baseline_levers"]) == {"sequential", "distmm", "optimus"}


def test_out_of_time_the_untuned_baselines_are_reported_as_placed(tight, monkeypatch) -> None:
    """Renaming an untuned baseline's devices only refines the report: past the budget it
    is left out, and the plan names the baselines reported as placed."""
    renamed: list[str] = []
    real = make_module.relabel_and_spread

    def spy(ctx, ev, *args, **kwargs):
        renamed.append(ev.schedule.name)
        return real(ctx, ev, *args, **kwargs)

    monkeypatch.setattr(make_module, "relabel_and_spread", spy)
    cost = make_cost_model(tight.cluster)
    plan = make_plan(tight, cost, time_limit_s=1e-6, jobs=0)
    (note,) = [n for n in plan.notes if n.startswith(AS_PLACED_NOTE)]
    as_placed = set(note.split(": ", 1)[1].split(", "))
    assert as_placed and not as_placed & set(renamed)
    assert validate_plan(plan) == []


def test_a_baseline_reported_at_a_plan_that_overflows_claims_no_speed_up(tight) -> None:
    """Where no fitting plan of a baseline was found (out of time, or at no setting of the
    levers), the plan says so and the summary gives its time without a speed-up."""
    tighter = with_memory(tight, 200)  # the untuned sequential and distmm plans overflow
    plan = make_plan(tighter, make_cost_model(tighter.cluster), time_limit_s=1e-6, jobs=0)
    over = plan.extra["baselines_overflow"]
    assert "sequential" in over and "optimus" not in over
    lines = summary_text(summary(plan)).splitlines()
    for name in ("sequential", "distmm", "optimus"):
        (line,) = [x for x in lines if x.strip().startswith(f"vs {name} ")]
        assert ("no fitting plan found" in line) == (name in over)
        assert ("speed-up" in line) == (name not in over)


def test_the_budget_counts_from_the_callers_start(tight) -> None:
    """A caller whose own work counts (the CLI's start-up) passes when it started: a budget
    spent before planning began stops the search at its first fit, as a spent one does."""
    cost = make_cost_model(tight.cluster)
    seconds = 5.0
    late = make_plan(
        tight, cost, time_limit_s=seconds, jobs=0, started_at=time.perf_counter() - seconds
    )
    assert late.solver.wall_s >= seconds
    assert [n for n in late.notes if n.startswith("time limit reached")]
    fresh = make_plan(tight, cost, time_limit_s=seconds, jobs=0)
    assert fresh.solver.wall_s < seconds
    assert not [n for n in fresh.notes if n.startswith("time limit reached")]


def test_the_search_stops_where_the_time_left_would_not_hold_the_round(tight, monkeypatch) -> None:
    """Steps past the first fit start only while the budget has ``ROUND_TRIALS`` of the
    slowest setting left: with a round as long as a billion settings, the search stops at
    its first fit, however much of its share is unspent."""
    judge = Judge(("paper",), lambda _name, problem: paper_schedule(problem))
    cost = make_cost_model(tight.cluster)
    roomy = LeverSearch(tight, cost, budget=Budget.starting_now(1000.0))
    roomy.search(judge)
    assert roomy.slowest > 0
    monkeypatch.setattr(leversearch, "ROUND_TRIALS", 1e9)
    cramped = LeverSearch(tight, cost, budget=Budget.starting_now(1000.0))
    fit = cramped.search(judge)
    assert fit.best is not None and fit.best.fitting is not None
    assert len(cramped._contexts) < len(roomy._contexts)


def test_a_round_leaves_out_a_baseline_no_quicker_than_its_known_plan(tight) -> None:
    """A baseline whose compute alone under the round's levers is no quicker than a plan of
    it already placed elsewhere is not placed: it could be neither the pick nor reported."""
    cost = make_cost_model(tight.cluster)
    levers = LeverSearch(tight, cost).search(Judge(("paper",), _paper)).best.levers

    def round_with(known: dict[str, float]):
        ctx = context(tight, cost, levers, enforce=True)
        return plan_round(ctx, "default", 0.2, True, known=known)

    everything, pick = round_with({})
    assert {"sequential", "distmm", "optimus"} <= set(everything)
    beaten, beaten_pick = round_with({"optimus": 0.0})  # any floor is no quicker than that
    assert "optimus" not in beaten and {"sequential", "distmm"} <= set(beaten)
    assert beaten_pick.iteration_s == pick.iteration_s
    kept, _ = round_with({"optimus": float("inf")})
    assert kept["optimus"].iteration_s == everything["optimus"].iteration_s


def test_no_plan_of_a_round_is_quicker_than_its_compute_floor(tight) -> None:
    """What leaving a baseline out rests on: every candidate of a round, placed, timed,
    renamed and spread, takes at least its compute floor, at every k."""
    cost = make_cost_model(tight.cluster)
    for k in (1, 2, 4, 8):
        for zero_stage in (1, 2):
            ctx = context(tight, cost, Levers(k, zero_stage), enforce=False)
            evaluated, _ = plan_round(ctx, "default", 0.2, False)
            assert {"milp", "paper", "sequential", "distmm", "optimus"} <= set(evaluated)
            for ev in evaluated.values():
                assert ev.iteration_s >= compute_floor(ctx, ev.schedule) > 0


def test_the_commands_budget_counts_from_the_process_start() -> None:
    """``spindle`` run as a process counts its budget from the process's start (the
    interpreter's start-up and imports included), never more than ``MAX_START_UP_S`` back;
    where the system cannot say, from the call."""
    import spindle_dsl.cli as cli

    now = time.perf_counter()
    started = cli.process_started(now)
    assert now - cli.MAX_START_UP_S <= started <= now
    script = (
        "import time; t = time.perf_counter(); time.sleep(1.2); "
        "from spindle_dsl.cli import process_started; print(t - process_started(t))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert 0.0 <= float(out.stdout) < 1.0  # the interpreter's own start-up, not the sleep


def test_without_the_systems_word_the_budget_counts_from_the_call(monkeypatch) -> None:
    import builtins

    import spindle_dsl.cli as cli

    def unreadable(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(builtins, "open", unreadable)
    assert cli.process_started(123.0) == 123.0
