"""Runner-up rounds in a helper process (``planner.search.helpers``): the same round there as
here, every round done once and in order, a helper that dies or cannot load a round costing
only its own rounds, and ``make_plan`` using a helper only where asked or a core is spare."""

from __future__ import annotations

import os
import pickle
import time
import warnings
from dataclasses import replace

import pytest
import standins
from synth import count_calls

from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_file
from spindle_dsl.planner import make_plan
from spindle_dsl.planner.evaluate.build import context, evaluate_cached
from spindle_dsl.planner.model import levers as levers_module
from spindle_dsl.planner.model.levers import Levers
from spindle_dsl.planner.search import helpers as pool
from spindle_dsl.planner.search import leversearch
from spindle_dsl.planner.search import make as make_module
from spindle_dsl.planner.search import rounds as rounds_module
from spindle_dsl.planner.search.leversearch import Judge, LeverSearch, TrialRequest, remote_trial
from spindle_dsl.planner.search.rounds import RoundRequest, plan_round, remote_round
from spindle_dsl.planner.solver import isolate
from spindle_dsl.planner.solver.choice import choose_solver
from spindle_dsl.planner.starts.baselines import sequential_schedule


@pytest.fixture(scope="module")
def graph(spec_dir):
    path = spec_dir / "qwen_val.spindle"
    return compile_file(path, mix="pretrain", cluster_overrides={"devices": 16}).graph


def request(graph, k: int, scheduler: str = "paper") -> RoundRequest:
    cost = make_cost_model(graph.cluster)
    return RoundRequest(graph, cost, Levers(k), scheduler, 0.3, True, choose_solver())


def test_a_round_in_the_helper_is_the_round_here(graph) -> None:
    """The helper rebuilds the lever search's context from the graph, the cost model and the
    levers: the paper's round (no time limit involved) places and times every candidate the
    same there as here."""
    r = request(graph, 8)
    ctx = context(r.graph, r.cost, r.levers, enforce=True)
    evaluated, chosen = plan_round(ctx, r.scheduler, r.time_limit_s, r.check_memory, r.solver)
    (channel,) = pool.start(1)
    (there, there_chosen), caught = isolate.call(remote_round, (r,), 120, channel)
    assert caught == ()
    assert set(there) == set(evaluated)
    for name, ev in evaluated.items():
        assert there[name].schedule.waves == ev.schedule.waves
        assert there[name].iteration_s == ev.iteration_s
        assert there[name].placement.memory == ev.placement.memory
    assert there_chosen.schedule.name == chosen.schedule.name


def test_the_helper_solves_in_itself_and_says_so(graph) -> None:
    """Its MILPs run in the helper (already isolated from the caller), noted as such."""
    r = replace(request(graph, 8, scheduler="milp"), time_limit_s=0.2)
    (channel,) = pool.start(1)
    (_, chosen), _ = isolate.call(remote_round, (r,), 120, channel)
    assert "solver: highs (in a planning helper)" in chosen.schedule.notes


def test_every_round_is_done_once_in_order_here_or_by_the_helper(graph) -> None:
    requests = [request(graph, k) for k in (2, 4, 8, 16)]
    helpers = pool.start(1)
    assert isolate.ready(helpers[0], 60)  # (ready before the rounds: it takes some)
    ran_here: list[int] = []

    def here(i: int):
        ran_here.append(i)
        return ("here", os.getpid(), requests[i].levers.micro_batches)

    def own() -> str:
        import time

        time.sleep(1.0)  # the helper takes rounds meanwhile
        return "own"

    mine, rounds = pool.side_by_side(own, requests, here, helpers, standins.tag_round, 0.3)
    assert mine == "own"
    assert [r[2] for r in rounds] == [2, 4, 8, 16]
    by_helper = [r for r in rounds if r[0] == "helper"]
    assert by_helper and all(pid != os.getpid() for _, pid, _ in by_helper)
    assert len(by_helper) + len(ran_here) == 4 and len(set(ran_here)) == len(ran_here)


def test_a_helper_that_dies_costs_its_round_which_runs_here_with_a_warning(graph) -> None:
    requests = [request(graph, k) for k in (2, 4)]
    helpers = pool.start(1)
    assert isolate.ready(helpers[0], 60)

    def own() -> str:
        import time

        time.sleep(0.5)
        return "own"

    with pytest.warns(isolate.SolverCrashWarning, match="SIGSEGV.*did it here"):
        _, rounds = pool.side_by_side(
            own, requests, lambda i: ("here", i), helpers, standins.crash_round, 0.3
        )
    assert rounds == [("here", 0), ("here", 1)]


def test_a_round_the_helper_cannot_load_runs_here_quietly(graph) -> None:
    """A cost model a script defined pickles here but not in a fresh interpreter."""

    class ScriptCost:  # (a local class: it cannot even be pickled)
        pass

    r = replace(request(graph, 2), cost=ScriptCost())  # type: ignore[arg-type]
    helpers = pool.start(1)
    assert isolate.ready(helpers[0], 60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, rounds = pool.side_by_side(
            lambda: None, [r], lambda i: ("here", i), helpers, standins.tag_round, 0.3
        )
    assert rounds == [("here", 0)]


def test_make_plan_hands_runner_ups_to_a_helper_only_where_asked(graph, monkeypatch) -> None:
    seen: list[tuple[str, ...]] = []
    real = pool.side_by_side

    def spy(own, requests, here, helpers, *rest, **options):
        seen.append(tuple(helpers))
        return real(own, requests, here, helpers, *rest, **options)

    monkeypatch.setattr("spindle_dsl.planner.search.make.side_by_side", spy)
    cost = make_cost_model(graph.cluster)
    # a budget the lever search cannot outrun on a slow machine: runner-ups are planned only
    # while the search has spent under its share of it
    alone = make_plan(graph, cost, jobs=0, time_limit_s=40)
    helped = make_plan(graph, cost, jobs=1, time_limit_s=40)
    assert seen == [(), (pool.CHANNEL,)]
    # qwen_val at 16 devices has a runner-up: both plans report planning it
    for plan in (alone, helped):
        assert any(n.startswith("runner-up levers") for n in plan.notes)
    # a spare core decides by default
    monkeypatch.setattr(pool, "spare_cores", lambda: 0)
    assert pool.helper_count(None, 3) == 0 and pool.helper_count(2, 3) == 2
    monkeypatch.setattr(pool, "spare_cores", lambda: 5)
    assert pool.helper_count(None, 3) == 3


def test_kinds_a_script_registered_keep_the_rounds_here(graph, monkeypatch) -> None:
    from spindle_dsl.kinds import base

    kind = base.get_kind(graph.modules[0].kind)
    script_kind = type("ScriptKind", (type(kind),), {"__module__": "__main__"})()
    monkeypatch.setitem(base._REGISTRY, kind.name, script_kind)
    assert pool.kind_modules(graph) is None
    monkeypatch.undo()
    assert pool.kind_modules(graph) == ()


def test_kinds_from_a_module_the_helper_cannot_import_keep_the_round_here(graph) -> None:
    """Pytest's importlib mode, say: the module registering a kind is no import path's."""
    r = replace(request(graph, 2), kind_modules=("no_such_module_registering_kinds",))
    assert remote_round(r) is None
    helpers = pool.start(1)
    assert isolate.ready(helpers[0], 60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, rounds = pool.side_by_side(
            lambda: None, [r], lambda i: ("here", i), helpers, remote_round, r.time_limit_s
        )
    assert rounds == [("here", 0)]


def test_a_round_reuses_the_plans_the_search_placed_and_finds_the_same(graph, monkeypatch) -> None:
    """``RoundRequest.placed``: the plans the lever search placed under the round's levers
    seed the round's context, which then places only the others, and the round is the one it
    would be without them."""
    r = request(graph, 8)
    ctx = context(r.graph, r.cost, r.levers, enforce=True)
    plan_round(ctx, r.scheduler, r.time_limit_s, r.check_memory, r.solver)  # as the search
    placed = tuple(ctx.evaluated.values())
    assert placed
    calls = []
    real = rounds_module.evaluate_cached

    def counting(c, s):
        calls.append(s.waves not in c.evaluated)
        return real(c, s)

    monkeypatch.setattr(rounds_module, "evaluate_cached", counting)
    (alone, alone_chosen), _ = remote_round(r)
    fresh = sum(calls)
    calls.clear()
    (again, again_chosen), _ = remote_round(replace(r, placed=placed))
    assert sum(calls) == 0 < fresh  # every plan the round asked about was placed already
    assert again_chosen.iteration_s == alone_chosen.iteration_s
    assert {k: e.iteration_s for k, e in again.items()} == {
        k: e.iteration_s for k, e in alone.items()
    }


def test_with_no_runner_up_a_helper_takes_the_lower_bound_beside_the_round(
    spec_dir, monkeypatch
) -> None:
    """multitask_clip at 16 devices leaves no runner-up setting: the helper takes the lower
    bound while this process plans the round, and the plan is bounded as one planned
    alone."""
    graph = compile_file(spec_dir / "multitask_clip.spindle", cluster_overrides={"devices": 16})
    graph = graph.graph
    seen: list[tuple[str, tuple[str, ...]]] = []
    real = pool.side_by_side

    def spy(own, requests, here, helpers, remote, *rest, **options):
        seen.append((remote.__name__, tuple(helpers)))
        return real(own, requests, here, helpers, remote, *rest, **options)

    monkeypatch.setattr("spindle_dsl.planner.search.make.side_by_side", spy)
    cost = make_cost_model(graph.cluster)
    helped = make_plan(graph, cost, jobs=1)
    alone = make_plan(graph, cost, jobs=0)
    assert seen == [("remote_bound", (pool.CHANNEL,)), ("remote_round", ())]
    assert helped.lower_bound_s == alone.lower_bound_s
    timed = {"lp_wall_s"}  # (the LPs' solving time, which no two runs share)
    assert {k: v for k, v in helped.extra["bounds"].items() if k not in timed} == {
        k: v for k, v in alone.extra["bounds"].items() if k not in timed
    }


def test_a_setting_judged_in_the_helper_is_judged_the_same_here(graph) -> None:
    """The lever search's second setting, judged in a helper (``remote_trial``): the helper
    sends back its context, holding the plans it placed; adopted here, the trial reads the
    same plans, memory and times as a context built here, places none again, and a plan not
    yet placed places alike on both."""
    cost = make_cost_model(graph.cluster)
    judge = Judge(("paper", "optimus"), make_module._make)
    levers = Levers(4, 1)
    here = LeverSearch(graph, cost).trial(levers, judge)
    (channel,) = pool.start(1)
    request = TrialRequest(graph, cost, levers, judge)
    there, caught = isolate.call(remote_trial, (request,), 120, channel)
    assert caught == () and len(there.evaluated) == len(here.judged) > 0

    class Sent:  # the helper's answer, as ``Ahead.take`` hands it over
        def take(self):
            return there

    search = LeverSearch(graph, cost)
    search._ahead[levers] = Sent()
    trial = search.trial(levers, judge)
    ctx = trial.ctx
    assert ctx.graph is graph and ctx.cost is cost and ctx.memo is search.pricing.slices
    assert len(ctx.evaluated) == len(there.evaluated)  # none placed again
    for a, b in zip(here.judged, trial.judged, strict=True):
        assert a.schedule.waves == b.schedule.waves
        assert a.iteration_s == b.iteration_s and a.placement.memory == b.placement.memory
    mine = evaluate_cached(here.ctx, sequential_schedule(here.ctx.problem))
    adopted = evaluate_cached(ctx, sequential_schedule(ctx.problem))
    assert mine.iteration_s == adopted.iteration_s
    assert mine.placement.memory == adopted.placement.memory


def test_work_sent_ahead_is_taken_from_the_helper_or_given_back(graph) -> None:
    """A helper that is up does the work and ``take`` waits for it; where none is up,
    ``take`` gives the work back (None) and the caller does it; a helper that dies costs
    that piece, with a warning."""
    helpers = pool.start(1)
    assert isolate.ready(helpers[0], 60)
    sent = pool.Ahead(helpers[0], standins.tag_round, request(graph, 8), 0.3)
    _until_started(sent)
    who, pid, k = sent.take()
    assert who == "helper" and pid != os.getpid() and k == 8
    nowhere = pool.Ahead("no such helper", standins.tag_round, request(graph, 8), 0.3)
    assert nowhere.take() is None
    crashing = pool.Ahead(helpers[0], standins.crash_round, request(graph, 2), 0.3)
    _until_started(crashing)
    with pytest.warns(isolate.SolverCrashWarning, match="did it here"):
        assert crashing.take() is None


def _until_started(sent: pool.Ahead) -> None:
    """Wait for the helper to start the work (``take`` before then gives it back)."""
    deadline = time.monotonic() + 60
    while sent._state == "waiting" and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_lever_search_with_a_helper_finds_what_it_finds_alone(graph, monkeypatch) -> None:
    """The first search sends its second k ahead to the helper, which judges it; its trials,
    and so its choice, are those of the search without one."""
    cost = make_cost_model(graph.cluster)
    judge = make_module._quick("default")
    alone = LeverSearch(graph, cost).search(judge)
    (channel,) = pool.start(1)
    assert isolate.ready(channel, 60)
    taken: list = []
    real_take = pool.Ahead.take

    def take(self):
        taken.append(real_take(self))
        return taken[-1]

    monkeypatch.setattr(pool.Ahead, "take", take)
    monkeypatch.setattr(leversearch, "AHEAD_SIZE", 0)  # (a small job: here, none is sent)
    real_context = LeverSearch.context

    def slow_first(self, levers):  # this process busy with k = 1 while the helper starts
        if not self._contexts:
            time.sleep(0.3)
        return real_context(self, levers)

    monkeypatch.setattr(LeverSearch, "context", slow_first)
    helped_search = LeverSearch(graph, cost, helper=channel)
    helped = helped_search.search(judge)
    assert not helped_search._ahead and len(taken) == 1 and taken[0]  # judged there
    assert helped.best is not None and alone.best is not None
    assert helped.best.levers == alone.best.levers
    assert {k: t.time_s for k, t in helped.per_k.items()} == {
        k: t.time_s for k, t in alone.per_k.items()
    }


def test_while_the_helper_judges_the_second_k_the_search_judges_the_third(graph, monkeypatch):
    """Where the helper is still busy with the second k when this process gets there, this
    process judges the third k's setting first, rather than wait; the trials, and so the
    choice, are those of the search alone."""
    cost = make_cost_model(graph.cluster)
    judge = make_module._quick("default")
    alone = LeverSearch(graph, cost).search(judge)

    class Busy:  # a helper that has started the work; it gives it back when asked
        def busy(self) -> bool:
            return True

        def take(self) -> None:
            return None

    def send_ahead(self, levers, judge):
        self._ahead[levers] = Busy()

    monkeypatch.setattr(LeverSearch, "send_ahead", send_ahead)
    monkeypatch.setattr(leversearch, "AHEAD_SIZE", 0)
    search = LeverSearch(graph, cost, helper="busy")
    helped = search.search(judge)
    first, second, third = search.ks[:3]
    order = [levers.micro_batches for levers in search._contexts]
    assert order[:3] == [first, third, second]
    assert helped.best is not None and alone.best is not None
    assert helped.best.levers == alone.best.levers
    assert {k: t.time_s for k, t in helped.per_k.items()} == {
        k: t.time_s for k, t in alone.per_k.items()
    }


def test_the_bound_in_a_helper_prices_only_what_the_search_left(spec_dir, monkeypatch) -> None:
    """The bound request carries what the lever search priced (``priced_only``): the helper,
    which gets it pickled with the graph and cost model, prices fewer settings and bounds
    alike."""
    graph = compile_file(spec_dir / "multitask_clip.spindle", cluster_overrides={"devices": 16})
    graph = graph.graph
    cost = make_cost_model(graph.cluster)
    search = LeverSearch(graph, cost)
    ctx = search.search(make_module._quick("default")).best.ctx
    explored = tuple(search.explored)
    alone = make_module.BoundRequest(
        graph, cost, ctx.levers, search.stages, explored, choose_solver()
    )
    sent = replace(alone, pricing=search.pricing.priced_only())
    priced = count_calls(monkeypatch, levers_module, "_price")
    (bound_alone, _) = make_module.remote_bound(pickle.loads(pickle.dumps(alone)))
    from_scratch = len(priced)
    priced.clear()
    (bound_sent, _) = make_module.remote_bound(pickle.loads(pickle.dumps(sent)))
    assert len(priced) < from_scratch
    assert bound_sent.seconds == bound_alone.seconds and bound_sent.ks == bound_alone.ks
    assert bound_sent.lp_s == bound_alone.lp_s
