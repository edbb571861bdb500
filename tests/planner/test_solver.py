"""Solver choice and crash isolation: a solver that dies costs one solve, never the planner."""

from __future__ import annotations

import os
import random
import threading
import time
import warnings

import pytest
import standins
from synth import random_problem

from spindle_dsl.errors import PlanError
from spindle_dsl.planner.improve import resplit, wave_milp
from spindle_dsl.planner.model.problem import Schedule, schedule_errors
from spindle_dsl.planner.search.rounds import milp_schedule
from spindle_dsl.planner.solver import isolate
from spindle_dsl.planner.solver.choice import (
    ISOLATE_ENV,
    SOLVER_ENV,
    SolverChoice,
    choose_solver,
    highs_available,
)
from spindle_dsl.planner.starts.wavefront import paper_schedule

SOLVER_NAMES = [
    "cbc",
    pytest.param(
        "highs",
        marks=pytest.mark.skipif(not highs_available(), reason="HiGHS (highspy) is not installed"),
    ),
]


@pytest.fixture
def problem():
    return random_problem(random.Random(7), 16, 6)


def test_the_worker_is_another_process_and_is_reused():
    first = isolate.call(standins.worker_pid, (), 30)
    assert first != os.getpid()
    assert isolate.call(standins.worker_pid, (), 30) == first


def test_a_segfault_in_the_worker_is_an_exception_and_the_next_call_works():
    with pytest.raises(isolate.SolverCrash, match="SIGSEGV"):
        isolate.call(standins.segfault, (), 30)
    assert isolate.call(standins.worker_pid, (), 30) != os.getpid()


def test_a_hung_solve_is_killed_after_its_timeout():
    isolate.warm_up()
    isolate.call(standins.worker_pid, (), 30)  # started, so the timeout is the solve's own
    with pytest.raises(isolate.SolverCrash, match=r"no answer within 0\.5 s"):
        isolate.call(standins.hang, (), 0.5)


def test_a_python_error_in_the_solve_is_reported_and_the_worker_survives():
    pid = isolate.call(standins.worker_pid, (), 30)
    with pytest.raises(isolate.SolverCrash, match="ValueError"):
        isolate.call(standins.fail, (), 30)
    assert isolate.call(standins.worker_pid, (), 30) == pid


def test_an_abandoned_call_ends_at_once_with_its_workers_own_workers(tmp_path):
    channel = "abandon-test"
    pid = isolate.call(standins.worker_pid, (), 30, channel)
    pid_file = tmp_path / "inner.pid"
    ended: list[BaseException] = []

    def hang_there() -> None:
        try:
            isolate.call(standins.hang_with_a_worker, (str(pid_file),), 600, channel)
        except isolate.SolverCrash as e:
            ended.append(e)

    caller = threading.Thread(target=hang_there)
    caller.start()
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    inner = int(pid_file.read_text())
    isolate.abandon(channel)
    caller.join(10)
    assert not caller.is_alive() and "killed by SIGTERM" in str(ended[0])
    while _running(inner) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(inner), "the abandoned worker's own worker still runs"
    assert isolate.call(standins.worker_pid, (), 30, channel) not in (pid, os.getpid())


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_milp_schedule_survives_a_dying_solver(problem, monkeypatch):
    monkeypatch.setattr(wave_milp, "solve_local", standins.segfault)
    monkeypatch.setattr(resplit, "best_split", standins.segfault)
    with pytest.warns(isolate.SolverCrashWarning, match="SIGSEGV"):
        s = milp_schedule(problem, 1.0, solver=SolverChoice("cbc", isolated=True))
    assert schedule_errors(problem, s) == []
    assert s.score(problem) <= paper_schedule(problem).score(problem) * (1 + 1e-9)
    crashes = [n for n in s.notes if n.startswith("warning: solver failure")]
    assert len(crashes) == 1, s.notes  # after the first crash no further solve is tried


@pytest.mark.parametrize("solver", SOLVER_NAMES)
@pytest.mark.parametrize("isolated", [True, False])
def test_each_solver_plans_validly_and_beats_the_paper(problem, solver, isolated):
    with warnings.catch_warnings():
        warnings.simplefilter("error", isolate.SolverCrashWarning)
        s = milp_schedule(problem, 0.6, solver=SolverChoice(solver, isolated))
    assert schedule_errors(problem, s) == []
    assert s.score(problem) <= paper_schedule(problem).score(problem) * (1 + 1e-9)
    assert f"solver: {solver}" in s.notes[0]


@pytest.mark.parametrize("solver", SOLVER_NAMES)
def test_resplit_in_the_worker_matches_resplit_in_process(problem, solver):
    start = paper_schedule(problem)
    here = resplit.resplit(problem, start, 1.0, SolverChoice(solver, isolated=False))
    there = resplit.resplit(problem, start, 1.0, SolverChoice(solver, isolated=True))
    assert isinstance(there, Schedule) and schedule_errors(problem, there) == []
    assert there.compute_s(problem) == pytest.approx(here.compute_s(problem), rel=0.02)


def test_choose_solver_reads_the_environment(monkeypatch):
    monkeypatch.setenv(SOLVER_ENV, "CBC")
    monkeypatch.setenv(ISOLATE_ENV, "0")
    assert choose_solver() == SolverChoice("cbc", isolated=False)
    assert choose_solver("cbc", isolated=True).isolated
    monkeypatch.delenv(SOLVER_ENV)
    monkeypatch.delenv(ISOLATE_ENV)
    default = choose_solver()
    assert default.isolated and default.name == ("highs" if highs_available() else "cbc")


def test_bad_solver_settings_are_plan_errors(monkeypatch):
    with pytest.raises(PlanError, match="unknown solver 'gurobi'"):
        choose_solver("gurobi")
    monkeypatch.setenv(ISOLATE_ENV, "maybe")
    with pytest.raises(PlanError, match=ISOLATE_ENV):
        choose_solver("cbc")


def test_highs_missing_falls_back_to_cbc_with_a_note(monkeypatch):
    from spindle_dsl.planner.solver import choice as solver_mod

    monkeypatch.setattr(solver_mod, "highs_available", lambda: False)
    monkeypatch.delenv(SOLVER_ENV, raising=False)
    choice = solver_mod.choose_solver()
    assert choice.name == "cbc" and "HiGHS is not available" in choice.notes[0]
    with pytest.raises(PlanError, match="highspy"):
        solver_mod.choose_solver("highs")


def test_spindle_plan_prints_a_warning_not_a_core_dump(spec_dir, monkeypatch, capsys):
    from spindle_dsl.cli import main

    monkeypatch.setattr(wave_milp, "solve_local", standins.segfault)
    monkeypatch.setattr(resplit, "best_split", standins.segfault)
    spec = spec_dir / "tiny_mm.spindle"
    assert main(["plan", str(spec), "--solver", "cbc", "--time-limit", "0.5", "--quiet"]) == 0
    out = capsys.readouterr()
    assert "warning: solver failure" in out.err and "SIGSEGV" in out.err
    assert "MILP solver cbc" in out.out and "iteration:" in out.out


def test_spindle_plan_rejects_a_bad_solver_setting(spec_dir, monkeypatch, capsys):
    from spindle_dsl.cli import main

    spec = spec_dir / "tiny_mm.spindle"
    monkeypatch.setenv(SOLVER_ENV, "simplex")
    assert main(["plan", str(spec), "--quiet"]) == 1
    assert "unknown solver 'simplex'" in capsys.readouterr().err


def test_a_worker_that_cannot_start_is_a_solver_crash(monkeypatch):
    isolate.shutdown()
    monkeypatch.setattr(isolate.sys, "executable", "/nonexistent/python")
    isolate.warm_up()  # says nothing: the call reports it
    with pytest.raises(isolate.SolverCrash, match="could not start the solver process"):
        isolate.call(standins.worker_pid, (), 30)
    monkeypatch.undo()
    assert isolate.call(standins.worker_pid, (), 30) != os.getpid()


def test_a_warm_up_after_other_workers_waits_until_they_are_up(monkeypatch):
    """``warm_up(after=...)`` returns at once and starts its worker only once the workers it
    waits for have started (so that two children do not import beside the planner at once)."""
    channel = "deferred test"
    up = threading.Event()
    monkeypatch.setattr(isolate, "_up", lambda other: up.is_set())
    isolate.warm_up(channel, after=("another",))
    waiting = isolate._deferred[channel]
    waiting.join(0.2)
    assert waiting.is_alive() and not isolate.alive(channel)  # still waiting: nothing started
    up.set()
    waiting.join(30)
    assert not waiting.is_alive() and isolate.alive(channel)
    assert isolate.call(standins.worker_pid, (), 30, channel) != os.getpid()
    isolate.shutdown()


@pytest.mark.parametrize("solver", SOLVER_NAMES)
def test_models_are_solved_with_the_garbage_collector_paused(problem, solver, monkeypatch):
    """A collection that frees a HiGHS model while cffi parses a type deadlocks the process
    (``choice.collector_paused``): every solve of the re-split and of the LP bound runs with
    the collector paused, and it runs again afterwards."""
    import gc

    import mip

    from spindle_dsl.planner.bound.lp_bound import lp_bound

    seen: list[bool] = []
    optimize = mip.Model.optimize

    def spy(self, *args, **kwargs):
        seen.append(gc.isenabled())
        return optimize(self, *args, **kwargs)

    monkeypatch.setattr(mip.Model, "optimize", spy)
    resplit.best_split(problem, paper_schedule(problem), 1.0, solver)
    lp_bound(problem, 1, SolverChoice(solver, isolated=False))
    assert len(seen) >= 2 and not any(seen)
    assert gc.isenabled()
