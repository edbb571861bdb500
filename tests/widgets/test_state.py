"""The planning session: caching, the last good plan, weight overrides, errors as values."""

from __future__ import annotations

import pytest

from spindle_dsl.widgets.state import FULL_TIME_LIMIT_S, PlanningSession, Settings

TEXT = "spec line 1\nspec line 2\n"


def make(fake_pipeline, **kw) -> PlanningSession:
    return PlanningSession(fake_pipeline, Settings(text=TEXT, path="x.spindle", **kw))


def test_first_view_is_a_plan(fake, fake_pipeline):
    s = make(fake_pipeline)
    assert s.view.ok and not s.view.stale and s.view.error is None
    assert s.view.result.plan.cluster.devices == 4
    assert s.view.result.warnings == ("warning: a fake warning",)
    assert len(fake.compiles) == 1 and len(fake.plans) == 1 and fake.draws == 1
    assert s.view.timings.total_s > 0 and not s.view.cached


def test_changed_inputs_replan_and_unchanged_ones_come_from_the_cache(fake, fake_pipeline):
    s = make(fake_pipeline)
    first = s.view.result.plan.iteration_s
    v8 = s.update(devices=8)
    assert v8.result.plan.iteration_s < first
    assert v8.result.plan.cluster.devices == 8
    assert len(fake.plans) == 2
    back = s.update(devices=None)
    again = s.update(devices=8)
    assert back.cached and again.cached
    assert again.result.plan is v8.result.plan
    assert len(fake.compiles) == 2 and len(fake.plans) == 2 and fake.draws == 2
    assert again.timings.total_s == 0
    s.update(scheduler="other")
    assert fake.plans[-1] == (8, "other") and len(fake.compiles) == 2  # no recompile


def test_broken_spec_keeps_the_last_good_plan(fake_pipeline):
    s = make(fake_pipeline)
    good = s.update(devices=16).result
    bad = s.update(text="spec line 1\nan ERROR here\nok\nERROR again\n")
    assert bad.error is not None and "this line is wrong" in bad.error
    assert "x.spindle:2:1: error" in bad.error and "x.spindle:4:1: error" in bad.error
    assert bad.error_lines == (2, 4)
    assert bad.stale and not bad.ok
    assert bad.result is good and bad.result.plan.cluster.devices == 16
    # moving a control while the spec is broken still shows the error and the old plan
    still = s.update(devices=8)
    assert still.stale and still.result is good
    fixed = s.update(text=TEXT)
    assert fixed.ok and fixed.result.plan.cluster.devices == 8


def test_plan_error_keeps_the_last_good_plan(fake_pipeline):
    s = make(fake_pipeline)
    good = s.view.result
    v = s.update(devices=200)
    assert v.stale and v.result is good and "gives up above 100" in v.error
    assert v.error_lines == ()


def test_no_plan_at_all_when_the_first_spec_is_broken(fake_pipeline):
    s = PlanningSession(fake_pipeline, Settings(text="ERROR\n"))
    assert s.view.result is None and s.view.error and not s.view.stale


def test_weights_compile_a_generated_mix(fake, fake_pipeline):
    s = make(fake_pipeline)
    before = s.view.result.graph.task("a").batch
    v = s.update(weights={"a": 1.0, "b": 3.0})
    text, mix, _ = fake.compiles[-1]
    assert mix == "custom" and text.startswith(TEXT)
    assert "mix custom {\n  global_batch = 32\n  a = 1\n  b = 3\n}" in text
    assert v.result.effective_mix == "custom" and v.result.effective_text == text
    assert v.result.graph.task("a").batch == 8 != before
    assert v.result.mixes[0].name == "default"  # the dropdown still lists the declared mixes
    # the declared weights again: the spec's own mix, straight from the cache
    n = len(fake.compiles)
    v2 = s.update(weights={"a": 3.0, "b": 1.0})
    assert v2.cached and v2.result.effective_mix == "default" and len(fake.compiles) == n


def test_a_task_at_weight_zero_is_left_out_and_all_zero_is_an_error(fake, fake_pipeline):
    s = make(fake_pipeline)
    s.update(weights={"a": 0.0})
    assert "  a =" not in fake.compiles[-1][0] and "  b = 1" in fake.compiles[-1][0]
    v = s.update(weights={"a": 0.0, "b": 0.0})
    assert v.stale and "weight 0" in v.error
    v = s.update(weights={"a": -1.0, "b": 1.0})
    assert v.stale and "must be a number >= 0" in v.error


def test_choosing_another_mix_drops_the_weight_overrides(fake_pipeline):
    s = make(fake_pipeline)
    s.update(weights={"a": 1.0, "b": 5.0})
    v = s.update(mix="even")
    assert v.settings.weights == () and v.result.effective_mix == "even"


def test_unknown_scheduler_is_a_clear_error(fake_pipeline):
    v = make(fake_pipeline).update(scheduler="magic")
    assert v.stale and "unknown scheduler 'magic' (known: default, other)" in v.error


def test_check_memory_off_shows_a_plan_that_overflows(fake_pipeline):
    s = make(fake_pipeline)
    assert s.update(devices=200).stale
    v = s.update(check_memory=False)
    assert v.ok and v.result.plan.cluster.devices == 200


def test_time_limit_reaches_the_planner_and_must_be_positive(fake, fake_pipeline):
    s = make(fake_pipeline)
    s.update(time_limit_s=2.0)
    assert len(fake.plans) == 2  # a new limit is a new plan (not served from the cache)
    assert s.update(time_limit_s=0).stale


def test_weights_of_tasks_the_spec_no_longer_has_are_dropped(fake, fake_pipeline):
    s = make(fake_pipeline)
    v = s.update(weights={"a": 1.0, "gone": 5.0})
    text = fake.compiles[-1][0]
    assert v.ok and "gone" not in text and "  a = 1\n" in text


def test_the_full_search_replaces_a_quick_plan_where_quicker(fake, refining_pipeline):
    s = make(refining_pipeline)
    quick = s.view.result.plan
    wanted = s.refinement()
    assert wanted.options.time_limit_s == FULL_TIME_LIMIT_S and not s.view.full_search
    shown = s.adopt(wanted, refining_pipeline.refine(wanted.graph, wanted.options))
    assert shown is s.view and shown.full_search and shown.ok
    assert shown.result.plan.iteration_s == pytest.approx(0.8 * quick.iteration_s)
    assert s.refinement() is None  # nothing left to search for these settings
    s.update(devices=8)
    assert s.refinement() is not None and not s.view.full_search
    back = s.update(devices=None)  # the full search's plan, from the cache
    assert back.cached and back.full_search and back.result.plan is shown.result.plan
    assert fake.plans == [(4, "default"), (8, "default")] and fake.refines == [(4, 10.0)]


def test_a_full_plan_for_settings_no_longer_shown_waits_in_the_cache(refining_pipeline):
    s = make(refining_pipeline)
    wanted = s.refinement()
    moved = s.update(devices=8)
    assert s.adopt(wanted, refining_pipeline.refine(wanted.graph, wanted.options)) is None
    assert s.view is moved and not s.view.full_search
    assert s.update(devices=None).full_search


def test_a_full_search_no_quicker_leaves_the_quick_plan(fake, refining_pipeline):
    fake.full_factor = 1.2
    s = make(refining_pipeline)
    quick = s.view.result.plan
    wanted = s.refinement()
    shown = s.adopt(wanted, refining_pipeline.refine(wanted.graph, wanted.options))
    assert shown.full_search and shown.result.plan is quick and s.refinement() is None


def test_nothing_to_search_further(fake_pipeline, refining_pipeline):
    assert make(fake_pipeline).refinement() is None  # no full search stage
    assert make(refining_pipeline, time_limit_s=FULL_TIME_LIMIT_S).refinement() is None
    s = make(refining_pipeline)
    s.update(text="ERROR\n")  # a stale plan is not searched further
    assert s.view.stale and s.refinement() is None


def test_the_full_search_budget_is_the_planners_default():
    from spindle_dsl.planner import DEFAULT_TIME_LIMIT_S

    assert FULL_TIME_LIMIT_S == DEFAULT_TIME_LIMIT_S


def test_settings_the_cache_forgot_are_searched_again(refining_pipeline):
    s = PlanningSession(refining_pipeline, Settings(text=TEXT, path="x.spindle"), cache_size=1)
    wanted = s.refinement()
    assert s.adopt(wanted, refining_pipeline.refine(wanted.graph, wanted.options)).full_search
    s.update(devices=8)  # (the one-entry cache forgets the full plan)
    again = s.update(devices=None)
    assert not again.full_search and s.refinement() is not None
