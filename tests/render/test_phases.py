"""A schedule's plans drawn: the phases on one timeline of training steps, and the report."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from spindle_dsl.cli import main
from spindle_dsl.language import compile_file
from spindle_dsl.planner.search.phases import plan_schedule
from spindle_dsl.render.phases import bundle_palette, phase_bars, phases_svg
from spindle_dsl.render.report import build_bundle_report

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_spec = importlib.util.spec_from_file_location(
    "report_tests", Path(__file__).with_name("test_report.py")
)
report_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_tests)


@pytest.fixture(scope="module")
def scheduled():
    schedule = compile_file(EXAMPLES / "tiny_schedule.spindle").schedule
    return schedule, plan_schedule(schedule, scheduler="paper", jobs=0)


def test_the_phases_picture_has_a_band_per_phase_and_a_bar_per_task_and_phase(scheduled):
    _, bundle = scheduled
    bars = phase_bars(bundle)
    assert [(b.first_step, b.mix, dict(b.batches)) for b in bars] == [
        (0, "warmup", {"caption": 24, "transcribe": 8}),
        (3, "caption_only", {"caption": 32}),
        (6, "balanced", {"caption": 24, "transcribe": 24}),
    ]
    svg = ET.fromstring(phases_svg(bundle))
    ns = "{http://www.w3.org/2000/svg}"
    titles = ["".join(t.itertext()) for t in svg.iter(f"{ns}title")]
    assert [t for t in titles if ": batch" in t] == [
        "caption: batch 24 in phase 1",
        "transcribe: batch 8 in phase 1",
        "caption: batch 32 in phase 2",
        "caption: batch 24 in phase 3",
        "transcribe: batch 24 in phase 3",
    ]
    text = " ".join("".join(t.itertext()) for t in svg.iter(f"{ns}text"))
    assert "caption_only" in text and "/step" in text and "training steps" in text
    # a task keeps one colour in every phase
    colours = bundle_palette(bundle)
    fills = {r.get("fill") for r in svg.iter(f"{ns}rect") if "caption:" in "".join(r.itertext())}
    assert fills == {colours["caption"].base}


def test_the_report_of_a_bundle_shows_the_phases_then_each_plan(scheduled, no_dot):
    schedule, bundle = scheduled
    graphs = {p.mix: p.graph for p in schedule.phases}
    html = build_bundle_report(bundle, graphs).html
    assert "<h2>Phases</h2>" in html and 'alt="phases"' in html
    for i, mix in enumerate(("warmup", "caption_only", "balanced"), start=1):
        assert f"<h2>Phase {i}: mix {mix}" in html and f"id='phase-{i}'" in html
    assert html.count("<h3>Timeline</h3>") == 3
    assert "<td>3-5</td><td>caption_only</td>" in html
    report_tests.assert_self_contained(html)


def test_spindle_report_on_a_scheduled_spec_and_on_a_bundle(tmp_path, capsys):
    spec = str(EXAMPLES / "tiny_schedule.spindle")
    bundle = tmp_path / "b.json"
    assert main(["plan", spec, "--scheduler", "paper", "--out", str(bundle), "--quiet"]) == 0
    for source, out in ((spec, tmp_path / "a.html"), (str(bundle), tmp_path / "b.html")):
        assert main(["report", source, "--scheduler", "paper", "-o", str(out)]) == 0
        assert "Phase 3: mix balanced" in out.read_text()
    capsys.readouterr()
    assert main(["render", str(bundle), "--what", "waves"]) == 1  # one picture per plan
    assert "is a plan bundle of 3 phases" in capsys.readouterr().err
