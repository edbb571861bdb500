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
    w = PlannerWidget.from_file(EXAMPLES / "tiny_schedule.spindle", debounce_s=0)
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
