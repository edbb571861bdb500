"""The widget's wiring, driven through traits with plain pytest (no kernel), on fake stages.

These pin down what each control does to the session and what each output shows, whatever
the real planner's figures; ``test_widget.py`` repeats the essentials on the real pipeline.
"""

from __future__ import annotations

import itertools

import pytest

from spindle_dsl.widgets.planner_widget import PlannerWidget

TEXT = "line 1\nline 2\n"


class ManualClock:
    def __init__(self) -> None:
        self.pending: list = []

    def __call__(self, delay, fn):
        entry = [fn, False]
        self.pending.append(entry)

        class Handle:
            def cancel(_self):
                entry[1] = True

        return Handle()

    def fire(self) -> None:
        for entry in self.pending:
            if not entry[1]:
                entry[1] = True
                entry[0]()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def widget(fake_pipeline, clock) -> PlannerWidget:
    return PlannerWidget.from_text(TEXT, "x.spindle", pipeline=fake_pipeline, timer=clock)


def outputs(w: PlannerWidget) -> tuple[str, str, str, str]:
    return (w.summary.value, w.waves.value, w.timeline.value, w.memory.value)


def test_initial_state_mirrors_the_spec(widget):
    assert widget.devices.value == 4 and widget.device.value == "cpu"
    assert list(widget.mix.options) == ["default", "even"] and widget.mix.value == "default"
    assert {s.description: s.value for s in widget.weights.children} == {"a": 3.0, "b": 1.0}
    assert "waves 4/" in widget.waves.value and "4 × cpu" in widget.summary.value
    assert "2.00×" in widget.summary.value  # the fake's sequential baseline is twice the plan
    assert "a fake warning" in widget.summary.value
    assert widget.errors.value == "" and "re-planned in" in widget.status.value


def test_each_control_redraws_the_outputs(widget, fake):
    seen = [outputs(widget)]
    widget.devices.value = 8
    assert widget.plan.cluster.devices == 8 and "8 × cpu" in widget.summary.value
    seen.append(outputs(widget))
    widget.device.value = "H100-80GB"
    assert widget.plan.cluster.device == "H100-80GB"
    seen.append(outputs(widget))
    widget.scheduler.value = "other"
    assert widget.plan.solver.name == "other"
    seen.append(outputs(widget))
    sliders = {s.description: s for s in widget.weights.children}
    sliders["a"].value = 1.0
    assert widget.view.result.graph.task("a").batch == 16  # a=1, b=1 of 32
    seen.append(outputs(widget))
    for before, after in itertools.pairwise(seen):
        assert before[0] != after[0]  # the summary changed every time
    assert seen[0][1] != seen[1][1] != seen[4][1]  # and the waves with devices and weights
    widget.devices.value = 4
    assert "re-planned in" in widget.status.value
    widget.devices.value = 8
    assert "from cache" in widget.status.value


def test_choosing_a_mix_resets_the_weight_sliders(widget):
    widget.set_weights(a=0.5)
    assert widget.view.settings.weights == (("a", 0.5), ("b", 1.0))
    widget.mix.value = "even"
    assert widget.view.result.effective_mix == "even"
    assert {s.description: s.value for s in widget.weights.children} == {"a": 1.0, "b": 1.0}


def test_typing_is_debounced_and_errors_keep_the_last_good_plan(widget, fake, clock):
    good = outputs(widget)
    n = len(fake.compiles)
    for text in ("line 1\nE", "line 1\nER", "line 1\nERROR"):
        widget.spec_text.value = text
    assert len(fake.compiles) == n  # nothing compiled while typing
    clock.fire()
    assert len(fake.compiles) == n + 1 and fake.compiles[-1][0] == "line 1\nERROR"
    assert "errors on line 2" in widget.errors.value
    assert "x.spindle:2:1: error: this line is wrong" in widget.errors.value
    assert widget.waves.value == good[1] and widget.timeline.value == good[2]
    assert "last good plan" in widget.summary.value
    widget.devices.value = 8  # still broken: the error stays, the old plan stays
    assert "errors on line 2" in widget.errors.value and widget.waves.value == good[1]
    widget.spec_text.value = TEXT
    widget.flush()
    assert widget.errors.value == "" and "last good plan" not in widget.summary.value
    assert widget.plan.cluster.devices == 8


def test_a_spec_broken_from_the_start_shows_only_the_error(fake_pipeline):
    w = PlannerWidget.from_text("ERROR\n", pipeline=fake_pipeline, debounce_s=0)
    assert w.plan is None and "no plan yet" in w.summary.value
    assert "errors on line 1" in w.errors.value and w.waves.value == ""
    w.spec_text.value = TEXT  # debounce_s=0: re-plans at once
    assert w.plan is not None and w.errors.value == ""


def test_missing_file_is_a_spec_error(tmp_path, fake_pipeline):
    from spindle_dsl.errors import SpecError

    with pytest.raises(SpecError, match="cannot read spec"):
        PlannerWidget.from_file(tmp_path / "nope.spindle", pipeline=fake_pipeline)


def test_weight_slider_steps_divide_the_declared_weights():
    from spindle_dsl.widgets.planner_widget import _slider_step

    assert _slider_step([3.0, 1.0]) == 0.1
    assert _slider_step([0.3, 0.2, 0.1]) == pytest.approx(0.01)
    assert _slider_step([0.125, 1.0]) == pytest.approx(1e-4)


def test_a_bug_in_a_stage_is_shown_not_raised(fake, fake_pipeline, caplog):
    w = PlannerWidget.from_text(TEXT, pipeline=fake_pipeline, debounce_s=0)
    good = outputs(w)

    def broken_plan(graph, options):
        raise ValueError("max() arg is an empty sequence")

    w.session.pipeline = fake_pipeline.__class__(
        fake.compile, broken_plan, fake.draw, fake_pipeline.schedulers
    )
    w.devices.value = 8
    assert "internal error (please report it): ValueError" in w.errors.value
    assert outputs(w) == good and "planning failed" in caplog.text


def test_the_full_search_follows_each_quick_plan(fake, refining_pipeline, clock):
    w = PlannerWidget.from_text(TEXT, "x.spindle", pipeline=refining_pipeline, timer=clock)
    assert w.wait_full(10) and fake.refines == [(4, 10.0)]
    w.devices.value = 8
    assert w.wait_full(10) and fake.refines[-1] == (8, 10.0)
    assert "the full search's plan" in w.status.value
    full = w.plan.iteration_s
    assert f"waves 8/{full:.6f}" in w.waves.value  # its pictures drawn
    w.devices.value = 16
    assert w.wait_full(10)
    w.devices.value = 8  # back: the full search's plan, from the cache, nothing searched
    assert w.plan.iteration_s == full and len(fake.refines) == 3
    assert "the full search's plan (from cache)" in w.status.value
    w.close()


def test_follow_off_shows_the_quick_plans_alone(fake, refining_pipeline, clock):
    w = PlannerWidget.from_text(
        TEXT, "x.spindle", pipeline=refining_pipeline, timer=clock, follow=False
    )
    w.devices.value = 8
    assert w.wait_full(1) and fake.refines == [] and "re-planned in" in w.status.value
