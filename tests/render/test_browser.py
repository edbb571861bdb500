"""The HTML report opened in headless Chromium: no console errors, every picture decoded, and
a screenshot that is a real picture (not a blank page)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spindle_dsl.render.colors import palette
from spindle_dsl.render.report import write_report

pytestmark = [pytest.mark.needs_chromium, pytest.mark.needs_dot]

# Added to a copy of the page only: lists each image and whether the browser decoded it.
CHECKER = """<script>
window.addEventListener("load", () => {
  const out = [...document.images].map(i => ({alt: i.alt, ok: i.complete && i.naturalWidth > 0,
                                             w: i.naturalWidth, h: i.naturalHeight}));
  const pre = document.createElement("pre"); pre.id = "spindle-check";
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def chromium(exe: str, page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on ``page``, logging console messages to stderr."""
    argv = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=3000",
        *extra,
        page.resolve().as_uri(),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def check_page(exe: str, html_path: Path, tmp: Path) -> tuple[list[str], list[dict], Path]:
    """(console messages, images as the browser saw them, screenshot path)."""
    shot = tmp / "report.png"
    run = chromium(exe, html_path, tmp, f"--screenshot={shot}", "--window-size=1400,3000")
    assert run.returncode == 0, run.stderr[-2000:]
    messages = console_messages(run.stderr)
    probe = tmp / "probe.html"
    probe.write_text(html_path.read_text().replace("</body>", CHECKER + "</body>"))
    dom = chromium(exe, probe, tmp, "--dump-dom").stdout
    found = re.search(r'<pre id="spindle-check">(.*?)</pre>', dom, re.S)
    assert found, "the checker script did not run"
    images = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return messages, images, shot


def assert_readable_screenshot(shot: Path, tasks: list[str]) -> None:
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    assert img.size == (1400, 3000)
    small = img.resize((350, 750))
    colours = small.getcolors(maxcolors=350 * 750)
    assert colours is not None and len(colours) > 200  # pictures and text, not a blank page
    pixels = {rgb for _, rgb in img.getcolors(maxcolors=1400 * 3000) or []}
    for c in palette(tasks).colours:  # every task's colour is drawn somewhere on screen
        rgb = tuple(int(c.base[i : i + 2], 16) for i in (1, 3, 5))
        assert rgb in pixels, f"{c.task} colour {c.base} not on the screenshot"


def test_the_console_check_can_fail(chromium_exe, tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom'); nope();</script></body></html>")
    messages = console_messages(chromium(chromium_exe, bad, tmp_path, "--dump-dom").stderr)
    assert any("boom" in m for m in messages) and any("nope" in m for m in messages)


def test_hand_built_report_in_chromium(chromium_exe, plan, graph, tmp_path):
    page = tmp_path / "report.html"
    write_report(page, plan, graph)
    messages, images, shot = check_page(chromium_exe, page, tmp_path)
    assert messages == []
    assert sorted(i["alt"] for i in images) == sorted(
        ["MetaGraph", "Wave plan", "timeline", "memory per device"]
    )
    assert all(i["ok"] and i["w"] > 200 for i in images), images
    assert_readable_screenshot(shot, ["caption", "transcribe"])


def test_qwen_val_report_at_64_devices_in_chromium(chromium_exe, spec_dir, tmp_path):
    page = tmp_path / "report.html"
    spec = spec_dir / "qwen_val.spindle"
    # The analytic memory model keeps every activation of a 1024-sample batch (no recomputation,
    # no micro-batches), so no qwen_val plan fits 64 x 80 GiB under it; the report still draws
    # the fastest plan and flags the devices that overflow. A subprocess, as a user runs it
    # (and so a crash in the MILP solver fails this test instead of ending the session).
    argv = ["report", str(spec), "--devices", "64", "--no-memory-check", "-o", str(page)]
    done = subprocess.run(
        [sys.executable, "-m", "spindle_dsl", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    messages, images, shot = check_page(chromium_exe, page, tmp_path)
    assert messages == []
    assert sorted(i["alt"] for i in images) == sorted(
        ["MetaGraph", "Wave plan", "timeline", "memory per device"]
    )
    assert all(i["ok"] and i["w"] > 200 for i in images), images
    assert_readable_screenshot(shot, ["image_chat", "audio_chat", "av_chat", "text_chat"])
