"""The HTML report: self-contained, complete, and still useful without dot."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from spindle_dsl.render.report import build_report, write_report

IMG = re.compile(r'<img alt="([^"]+)" src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)">')


def _images(html: str) -> dict[str, str]:
    return {alt: base64.b64decode(data).decode() for alt, data in IMG.findall(html)}


def assert_self_contained(html: str) -> None:
    outside_data = re.sub(r"base64,[A-Za-z0-9+/=]+", "", html)
    assert "http://" not in outside_data and "https://" not in outside_data.replace(
        "https://graphviz.org/download/", ""
    )
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.search(r'src="(?!data:)', html)


@pytest.mark.needs_dot
def test_report_embeds_every_picture(plan, graph):
    report = build_report(plan, graph)
    assert report.warnings == ()
    images = _images(report.html)
    assert set(images) == {"MetaGraph", "Wave plan", "timeline", "memory per device"}
    for svg in images.values():
        assert ET.fromstring(svg).tag.endswith("svg")
    assert "vision_proj" in "".join(ET.fromstring(images["MetaGraph"]).itertext())
    assert_self_contained(report.html)


def test_report_sections_and_tables(plan, graph, no_dot):
    html = build_report(plan, graph).html
    for heading in (
        "MetaGraph",
        "Timeline",
        "Wave plan",
        "Waves",
        "Baselines",
        "Memory per device",
    ):
        assert f"<h2>{heading}</h2>" in html
    assert html.count("<tr>") >= 7 + 3  # 7 entries in the wave table, 3 schedules
    assert "transcribe/audio_proj</td><td>[0, 1)</td><td>2</td>" in html
    assert "data_parallel" in html and "0.86×" in html  # speed-up vs sequential
    assert "1.5 GiB" in html and "38% of capacity" in html  # device 1's peak of 4 GiB
    assert_self_contained(html)


def test_report_without_dot_shows_dot_source_and_how_to_install(plan, graph, no_dot):
    report = build_report(plan, graph)
    assert len(report.warnings) == 2
    assert "apt-get install graphviz" in report.html
    assert "digraph metagraph" in report.html and "digraph waves" in report.html
    assert set(_images(report.html)) == {"timeline", "memory per device"}


def test_report_without_memory_figures_says_so(plan, no_dot):
    report = build_report(replace(plan, memory_bytes=()))
    assert "records no memory figures" in report.html
    assert "the plan records no memory figures" in report.warnings


def test_write_report(plan, tmp_path, no_dot):
    out = tmp_path / "sub" / "r.html"
    write_report(out, plan)
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_report_flags_devices_over_memory(plan, no_dot):
    over = replace(plan, memory_bytes=(5 * 2**30, 2**30, 6 * 2**30, 2**30))
    report = build_report(over)
    assert "2 of 4 devices exceed" in report.html and "devices 0, 2" in report.html
    assert "2 devices exceed their memory" in report.warnings


def test_report_names_the_lp_bound_when_the_plan_has_one(plan, no_dot):
    assert "of the lower bound" in build_report(plan).html  # a plan from before the LP bound
    lp = replace(plan, extra={"bounds": {"lp_s": plan.lower_bound_s, "area_path_s": 0.1}})
    html = build_report(lp).html
    assert "LP lower bound" in html and "iteration / LP bound" in html
    assert f"{plan.iteration_s / plan.lower_bound_s:.2f}×" in html
    # where the compute over it goes: the entries' device-seconds over the LP's, and idle
    assert f"{plan.busy_s() / plan.lower_bound_s:.2f}×" in html
    assert "entries&#x27; device-seconds" in html
    assert "entries&#x27; device-seconds" not in build_report(plan).html  # no LP figure


def test_report_shows_the_memory_levers(plan, no_dot):
    rc = tuple(replace(m, recompute=m.id == "caption/lm") for m in plan.metaops)
    levered = replace(plan, micro_batches=4, zero_stage=2, metaops=rc)
    html = build_report(levered).html
    assert "<h3>Memory levers</h3>" in html
    assert "k = 4: the waves run 4 times per iteration" in html
    assert "2: optimizer state and gradients sharded" in html
    assert f"1 of {len(plan.metaops)} MetaOps: caption/lm" in html
    assert f"k=4, ZeRO-2, recompute 1/{len(plan.metaops)}" in html  # the card
