"""The planner widget on the real stages, driven through its traits with plain pytest.

What a person does in the notebook, done here by setting ``.value`` on the same controls:
move the devices slider, pick a device and a scheduler, drag a task's weight, break the spec
and fix it, export. Each step asserts that the outputs changed (or, for a broken spec, that
they kept the last good plan).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from spindle_dsl.plan import Plan
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.render.trace import check_trace
from spindle_dsl.widgets.planner_widget import PlannerWidget


@pytest.fixture
def tiny(spec_dir) -> Path:
    return spec_dir / "tiny_mm.spindle"


@pytest.fixture
def widget(tiny) -> PlannerWidget:
    return PlannerWidget.from_file(tiny, debounce_s=0, follow=False)


def pictures(w: PlannerWidget) -> tuple[str, str, str]:
    return (w.waves.value, w.timeline.value, w.memory.value)


def test_opens_on_what_the_spec_says(widget):
    assert widget.devices.value == 4 and widget.device.value == "cpu"
    assert widget.scheduler.value == "default" and "paper" in widget.scheduler.options
    assert widget.mix.value == "default"
    assert {s.description: s.value for s in widget.weights.children} == {
        "caption": 3.0,
        "transcribe": 1.0,
    }
    assert validate_plan(widget.plan) == []
    assert "4 × cpu" in widget.summary.value and "vs sequential" in widget.summary.value
    if shutil.which("dot"):
        assert widget.waves.value.startswith("<img")
    else:  # the waves as text, saying why (Graphviz missing), not an error
        assert "not installed" in widget.waves.value and "<pre>" in widget.waves.value
    assert "<svg" in widget.memory.value
    assert widget.errors.value == ""


def test_devices_slider_redraws_every_output(widget):
    before = pictures(widget)
    summary = widget.summary.value
    widget.devices.value = 2
    after = pictures(widget)
    assert widget.plan.cluster.devices == 2 and validate_plan(widget.plan) == []
    assert all(a != b for a, b in zip(before, after, strict=True))
    assert "2 × cpu" in widget.summary.value and widget.summary.value != summary
    print(re.sub("<[^>]+>", "", widget.status.value))  # the re-plan time, for the log


def test_device_scheduler_and_weights_change_the_plan(widget):
    widget.device.value = "H100-80GB"
    assert widget.plan.cluster.device == "H100-80GB"
    assert widget.view.result.graph.dtype_bytes == 2  # bf16 on a GPU preset
    widget.scheduler.value = "paper"
    assert widget.plan.solver.name == "paper"
    before = widget.plan
    widget.set_weights(caption=1.0)  # 1:1 instead of 3:1 over a global batch of 32
    graph = widget.view.result.graph
    assert graph.task("caption").batch == 16 and graph.task("transcribe").batch == 16
    assert widget.plan != before and validate_plan(widget.plan) == []
    assert widget.view.result.effective_mix == "custom"
    assert widget.mix.value == "default"  # the dropdown still names the declared mix


def test_broken_spec_shows_its_error_and_keeps_the_last_good_plan(widget, tiny):
    widget.devices.value = 2
    good_plan, good = widget.plan, pictures(widget)
    text = tiny.read_text()
    widget.spec_text.value = text.replace("-> vision ->", "-> visoin ->", 1)
    assert "did you mean 'vision'" in widget.errors.value
    line = text[: text.index("-> vision ->")].count("\n") + 1
    assert f"errors on line {line}" in widget.errors.value
    assert widget.plan is good_plan and pictures(widget) == good
    assert "last good plan" in widget.summary.value
    widget.spec_text.value = text
    assert widget.errors.value == "" and "last good plan" not in widget.summary.value
    assert widget.plan == good_plan


def test_every_broken_fixture_shows_its_first_error_line(spec_dir):
    for path in sorted((spec_dir / "broken").glob("*.spindle")):
        expect = re.match(r"# expect: (\d+)", path.read_text())
        w = PlannerWidget.from_file(path, debounce_s=0, follow=False)
        assert w.plan is None and "no plan yet" in w.summary.value, path.name
        lines = re.search(r"errors on line ([\d, ]+)", w.errors.value)
        assert lines, (path.name, w.errors.value)
        assert int(lines.group(1).split(",")[0]) <= int(expect.group(1)), path.name
        assert f"{path}:{expect.group(1)}:" in w.errors.value, path.name


def test_export_writes_plan_trace_report_and_spec(widget, tmp_path):
    widget.devices.value = 2
    widget.set_weights(transcribe=2.0)
    widget.export_dir.value = str(tmp_path / "out")
    widget.export_button.click()
    done = widget.last_export
    assert all(p.is_file() for p in done.paths), widget.export_status.value
    assert done.plan.name == "tiny_mm-2xcpu-custom.plan.json"
    assert Plan.read(done.plan) == widget.plan
    assert check_trace(json.loads(done.trace.read_text())) == []
    assert done.report.read_text().startswith("<!DOCTYPE html>")
    assert "mix custom {" in done.spec.read_text()
    assert "--mix custom --devices 2" in done.command and "--time-limit 0.4" in done.command
    assert str(done.plan) in widget.export_status.value


def test_export_to_a_file_path_is_a_clear_error(widget, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    widget.export_dir.value = str(blocker)
    widget.export_button.click()
    assert "it is a file, not a folder" in widget.export_status.value


def test_time_limit_and_memory_controls_reach_the_planner(widget):
    widget.time_limit.value = 1.0
    assert widget.view.settings.time_limit_s == 1.0 and widget.plan is not None
    widget.check_memory.value = False
    assert widget.view.settings.check_memory is False and widget.view.ok
    from spindle_dsl.widgets.export import reproduce_command

    command = reproduce_command(widget.view.result, Path("s.spindle"), Path("p.json"))
    assert command.endswith("--time-limit 1 --no-memory-check --out p.json")


def test_the_full_search_follows_in_a_process_of_its_own(tiny):
    w = PlannerWidget.from_file(tiny, debounce_s=0)
    quick = w.plan.iteration_s
    assert "searching further in the background" in w.status.value
    assert w.wait_full(120), "the full search did not end"
    assert "the full search's plan" in w.status.value and w.plan.iteration_s <= quick
    w.close()
