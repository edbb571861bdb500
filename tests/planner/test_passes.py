"""Switching the ``milp`` scheduler's passes off (for the ablation bench) works as stated."""

from __future__ import annotations

import random
import time

import pytest
from synth import random_problem

from spindle_dsl.planner.improve.polish import improve
from spindle_dsl.planner.model.levers import ALL_PASSES, NO_PASSES, PassOptions
from spindle_dsl.planner.model.problem import Schedule, schedule_errors
from spindle_dsl.planner.search import rounds as rounds_module
from spindle_dsl.planner.search.rounds import milp_schedule
from spindle_dsl.planner.solver.choice import SolverChoice
from spindle_dsl.planner.starts.wavefront import paper_schedule

IN_PROCESS = SolverChoice("highs", isolated=False)


def test_without_switches_one_pass_off_and_rejects_unknown_names():
    assert ALL_PASSES.without("polish") == PassOptions(polish=False)
    assert all(not getattr(NO_PASSES, n) for n in PassOptions.names())
    with pytest.raises(ValueError, match="unknown pass 'polsh'"):
        ALL_PASSES.without("polsh")


def test_no_passes_leaves_level_waves_unpolished():
    p = random_problem(random.Random(11), 8, 6)
    s = milp_schedule(p, 0.5, lambda s: (0.0, s.score(p)), IN_PROCESS, NO_PASSES)
    assert schedule_errors(p, s) == []
    assert s.compute_s(p) <= paper_schedule(p).compute_s(p) * (1 + 1e-9)
    notes = " ".join(s.notes)
    assert "best start: levels" in notes or "best start: paper" in notes  # no CPA, no tasks
    assert "polished" not in notes


def test_improve_without_resplit_keeps_each_op_in_its_waves():
    """Without the re-splits, ``improve`` only rebalances: no layer moves to another wave;
    with them, this problem's layers do move and its waves get shorter."""
    p = random_problem(random.Random(7), 8, 6)
    start = paper_schedule(p)

    def layers_per_wave(s):
        return [{q.op: q.layers for q in w} for w in s.waves]

    off = improve(p, start, 0.2, IN_PROCESS, PassOptions(resplit=False))
    assert layers_per_wave(off) == layers_per_wave(start)
    on = improve(p, start, 0.2, IN_PROCESS)
    assert layers_per_wave(on) != layers_per_wave(start)
    assert schedule_errors(p, on) == [] and on.compute_s(p) < start.compute_s(p)


def test_past_the_deadline_only_the_best_scored_start_is_improved(monkeypatch):
    """The round improves its starts best compute first while the call's time allows: with
    the deadline gone and steps that count as slow, one start is improved (a plan needs
    one), the note names the rest, and the plan is still a valid schedule; steps quicker
    than ``SLOW_STEP_S`` run whatever the clock says."""
    p = random_problem(random.Random(5), 10, 16)
    improved: list[Schedule] = []
    real = rounds_module.improve

    def counting(problem, sched, *args, **kwargs):
        improved.append(sched)
        return real(problem, sched, *args, **kwargs)

    monkeypatch.setattr(rounds_module, "improve", counting)

    def objective(s: Schedule) -> tuple[float, float]:
        return (0.0, s.compute_s(p))

    gone = time.perf_counter()
    quick = milp_schedule(p, 0.2, objective, IN_PROCESS, deadline=gone)
    assert len(improved) > 2
    assert not [n for n in quick.notes if n.startswith("time budget:")]
    every = list(improved)
    improved.clear()
    monkeypatch.setattr(rounds_module, "SLOW_STEP_S", 0.0)
    late = milp_schedule(p, 0.2, objective, IN_PROCESS, deadline=gone)
    assert len(improved) == 1
    assert improved[0].score(p) == min(s.score(p) for s in every)
    (note,) = [n for n in late.notes if n.startswith("time budget:")]
    assert note.endswith("not improved") and len(note.split(", ")) == len(every) - 1
    assert schedule_errors(p, late) == []
