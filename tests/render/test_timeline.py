"""The matplotlib timeline and the text views."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from spindle_dsl.errors import SpindleError
from spindle_dsl.plan.model import Entry, Wave
from spindle_dsl.render.schedule import activation_flows, idle_spans
from spindle_dsl.render.text import metagraph_text, timeline_text, waves_text
from spindle_dsl.render.timeline import timeline_bytes


def test_timeline_svg_shows_waves_tasks_and_idle(plan):
    svg = timeline_bytes(plan, "svg").decode()
    text = "".join(ET.fromstring(svg).itertext())
    for label in ("w0", "w1", "w2", "w3", "caption", "transcribe", "idle", "time (ms)"):
        assert label in text
    assert "vision [0,4)" in text and "lm [3,6)" in text
    assert 'id="h' in svg  # the idle hatch pattern


def test_timeline_png_and_pdf(plan):
    assert timeline_bytes(plan, "png").startswith(b"\x89PNG")
    assert timeline_bytes(plan, "pdf").startswith(b"%PDF")


def test_timeline_refuses_dot(plan):
    with pytest.raises(SpindleError, match="timeline can be written as svg"):
        timeline_bytes(plan, "dot")


def test_idle_spans_and_utilisation(plan):
    idle = idle_spans(plan)
    w1 = sorted((s.device, round(s.duration_s, 6)) for s in idle if s.wave == 1)
    assert w1 == [(1, 0.01), (2, 0.002), (3, 0.01)]
    busy = sum(e.time_s * len(e.devices) for w in plan.waves for e in w.entries)
    assert 1 - plan.idle_share() == pytest.approx(busy / (plan.iteration_s * 4))
    assert len(activation_flows(plan)) == 5


def test_text_timeline_merges_devices_that_do_the_same(plan):
    e = Entry("caption/vision", 0, 4, (0, 1, 2, 3), 0.048)
    one_wave = replace(plan, waves=(Wave(0, 0.0, 0.06, (e,)),), iteration_s=0.06)
    rows = [line for line in timeline_text(one_wave, 10).splitlines() if line.startswith("dev")]
    assert rows == ["dev 0-3 AAAAAAAA.."]


def test_text_timeline_rows(plan):
    text = timeline_text(plan, width=40)
    rows = [line for line in text.splitlines() if line.startswith("dev ")]
    assert [r.split()[1] for r in rows] == ["0", "1", "2", "3"]
    assert all(len(r.split()[2]) == 40 for r in rows)
    assert "A caption/vision" in text and "." in rows[3]


def test_text_waves_and_metagraph(plan, graph):
    assert "caption/lm                       layers [3,6)  devices 0-1 (2)  96 ms" in waves_text(
        plan
    )
    mg = metagraph_text(graph)
    assert "[frozen]" in mg and "[shares lm]" in mg and "<- image[16]" in mg


def test_timeline_draws_the_time_after_the_waves(plan):
    longer = replace(
        plan,
        iteration_s=plan.iteration_s + 0.1,
        breakdown=(("compute_s", plan.iteration_s), ("transfer_s", 0.1)),
    )
    text = "".join(ET.fromstring(timeline_bytes(longer, "svg")).itertext())
    assert text.count("transfer") == 2  # on the chart and in the legend
    assert "transfer" not in "".join(ET.fromstring(timeline_bytes(plan, "svg")).itertext())


def test_number_formats():
    from spindle_dsl.render.fmt import device_ranges, fmt_bytes, fmt_flops, fmt_seconds

    assert fmt_bytes(1000 * 2**30) == "1000 GiB"
    assert fmt_bytes(3 * 2**29) == "1.5 GiB"
    assert fmt_flops(4.41e15) == "4.41 PFLOP"
    assert fmt_seconds(2500.0) == "2500 s" and fmt_seconds(0.0123) == "12.3 ms"
    assert fmt_seconds(3e-5) == "30 µs"
    assert device_ranges([5, 0, 1, 2, 7, 6]) == "0-2, 5-7"
