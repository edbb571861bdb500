"""The planner widget on a spec with a schedule: every phase planned, shown on a timeline."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from spindle_dsl.plan.bundle import validate_bundle
from spindle_dsl.widgets.planner_widget import PlannerWidget

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _svg(markup: str) -> str:
    return base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)", markup).group(1)).decode()


def test_a_scheduled_spec_shows_its_phases_and_replans_each_once():
    w = PlannerWidget.from_file(EXAMPLES / "tiny_schedule.spindle", debounce_s=0, follow=False)
    result = w.view.result
    assert [(p.first_step, p.mix) for p in result.bundle.phases] == [
        (0, "warmup"),
        (3, "caption_only"),
        (6, "balanced"),
    ]
    assert validate_bundle(result.bundle) == []
    assert result.bundle.phases[0].plan is result.plan  # the plan shown is the first phase's
    assert w.mix.value == "warmup" and "<b>phases</b>" in w.phases.value
    svg = _svg(w.phases.value)
    assert "caption: batch 32 in phase 2" in svg and "transcribe: batch 24 in phase 3" in svg
    misses = w.session.cache_stats["plan_misses"]
    w.devices.value = 2  # every phase re-planned once, for 2 devices
    assert w.session.cache_stats["plan_misses"] == misses + 3
    assert {p.plan.cluster.devices for p in w.view.result.bundle.phases} == {2}
    # picking a mix sets the schedule aside: one plan, no phases
    w.mix.value = "caption_only"
    assert w.view.result.bundle is None and w.phases.value == ""
    assert {m.task for m in w.plan.metaops} == {"caption"}


def test_export_of_a_schedule_writes_its_bundle(tmp_path):
    from spindle_dsl.plan.bundle import read_plan_file

    w = PlannerWidget.from_file(EXAMPLES / "tiny_schedule.spindle", debounce_s=0, follow=False)
    w.export_dir.value = str(tmp_path)
    w.export()
    written = w.last_export
    assert written.bundle is not None and written.bundle in written.paths
    bundle = read_plan_file(written.bundle)
    assert [p.mix for p in bundle.phases] == ["warmup", "caption_only", "balanced"]
    assert "--mix" not in written.command and str(written.bundle) in written.command
    assert "Phase 3: mix balanced" in written.report.read_text()
