"""A person's use of the interactive notebook, in a real browser.

Voila serves ``notebooks/interactive_planning.ipynb``; headless Chromium (the system one,
driven by Playwright) opens it, waits for the wave picture, moves the devices slider with the
keyboard as a user would, and waits for the picture and the summary to change. A full-page
screenshot is kept in the test's temporary folder for a human to look at.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs_chromium

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

WAVES = ".spindle-waves img, .spindle-waves pre"
SLIDER = ".spindle-devices"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_moving_the_devices_slider_redraws_the_waves(chromium, voila_server, tmp_path):
    from playwright.sync_api import sync_playwright

    server = voila_server(NOTEBOOKS / "interactive_planning.ipynb")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(server.url, timeout=120_000)
            page.wait_for_selector(WAVES, timeout=120_000)
            readout = page.locator(f"{SLIDER} .widget-readout")
            before_devices = int(readout.inner_text())
            before_waves = page.inner_html(".spindle-waves")
            before_summary = page.inner_text(".spindle-summary")

            handle = page.locator(f"{SLIDER} .noUi-handle")
            handle.focus()
            for _ in range(4):
                page.keyboard.press("ArrowLeft")
            target = before_devices - 4
            # each key press is a slider change and a re-plan; wait for the last one to land
            page.wait_for_function(
                """([old, want]) =>
                    document.querySelector('.spindle-waves').innerHTML !== old &&
                    document.querySelector('.spindle-summary').innerText.includes(want)""",
                arg=[before_waves, f"{target} ×"],
                timeout=60_000,
            )
            after_devices = int(readout.inner_text())
            after_summary = page.inner_text(".spindle-summary")
            shot = tmp_path / "interactive_planning.png"
            page.screenshot(path=str(shot), full_page=True)

            # type a mistake at the end of the spec: after the debounce the error shows,
            # and the picture stays the last good plan
            good_waves = page.inner_html(".spindle-waves")
            area = page.locator(".spindle-spec textarea")
            area.click()
            page.keyboard.press("Control+End")
            page.keyboard.type("\nmix oops {")
            page.wait_for_selector(".spindle-errors pre", timeout=30_000)
            error_text = page.inner_text(".spindle-errors")
            still_waves = page.inner_html(".spindle-waves")
            page.screenshot(path=str(tmp_path / "spec_error.png"), full_page=True)
            for _ in range(len("\nmix oops {")):
                page.keyboard.press("Backspace")
            page.wait_for_selector(".spindle-errors pre", state="detached", timeout=30_000)

            # export with one click, into the test's folder
            folder = page.locator(".spindle-export-dir input")
            folder.fill(str(tmp_path / "export"))
            folder.press("Enter")
            page.click(".spindle-export-button")
            page.wait_for_selector(".spindle-export-status li", timeout=60_000)
        finally:
            browser.close()

    print(f"screenshot: {shot}")
    assert after_devices == target
    assert f"{after_devices} ×" in after_summary and f"{before_devices} ×" in before_summary
    assert after_summary != before_summary
    width, height = png_size(shot.read_bytes())
    assert width >= 1500 and height >= 1100
    assert "error" in error_text and "oops" in error_text
    assert still_waves == good_waves
    exported = sorted(p.name for p in (tmp_path / "export").iterdir())
    assert [n.split(".", 1)[1] for n in exported] == [
        "plan.json",
        "report.html",
        "spindle",
        "trace.json",
    ], exported
    log = server.log.read_text()
    assert "Traceback" not in log, log[-3000:]
