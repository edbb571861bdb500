"""``PlannerWidget``: plan a spec interactively in Jupyter (or Voila).

The widget is a shell over ``PlanningSession``: every control writes one field of the session's
settings and every output is an ``HTML`` widget whose value is redrawn from the session's view.
Keeping all state in traits (no ``Output`` capture) means the whole widget can be driven from
plain pytest, by setting ``.value`` on the controls, exactly as the browser front end does.

Controls that change in steps (sliders, dropdowns) re-plan at once: the session caches every
stage, so this costs one plan. The spec text area re-plans only after the user pauses typing
(``debounce_s``), and a broken spec shows its diagnostics while the outputs keep the last good
plan, greyed, so the user never loses the picture they are fixing.

Each re-plan is a short search (the time box, half a second by default); the planner's full
search then runs in the background (``follow.Follower``) and its plan replaces the one shown
where quicker, the status line saying which is shown. Touching a control abandons it.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from html import escape
from pathlib import Path
from typing import Any

import ipywidgets as w

from spindle_dsl.cluster import PRESETS
from spindle_dsl.errors import SpecError, SpindleError
from spindle_dsl.plan.model import Plan
from spindle_dsl.widgets.debounce import Debouncer, TimerFactory, default_timer
from spindle_dsl.widgets.follow import Follower
from spindle_dsl.widgets.mixes import MixInfo
from spindle_dsl.widgets.state import (
    INTERACTIVE_TIME_LIMIT_S,
    Pipeline,
    PlanningSession,
    Refinement,
    Result,
    Settings,
    View,
)
from spindle_dsl.widgets.summary import summarize, summary_html

DEFAULT_MAX_DEVICES = 64
log = logging.getLogger(__name__)

# Styles the widget's own parts only (every selector starts with a spindle- class).
CSS = (
    ".spindle-spec textarea{font-family:monospace;font-size:12px;white-space:pre}"
    ".spindle-waves img,.spindle-timeline img{max-width:100%}"
)


def read_spec(path: str | os.PathLike[str]) -> str:
    """The spec file's text, or a SpecError a user can act on."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file (expected a .spindle spec)") from None


def _html(css_class: str) -> w.HTML:
    """An empty HTML output the page's CSS and the browser tests find by ``css_class``."""
    out = w.HTML()
    out.add_class(css_class)
    return out


class PlannerWidget(w.VBox):
    """Controls on the left (cluster, mix weights, scheduler, spec text), outputs on the right
    (summary, waves, timeline, memory), and a one-click export underneath.

    Build it with ``PlannerWidget.from_file(path)`` or ``PlannerWidget.from_text(text)``.
    ``follow=False`` shows the quick plans alone (no full search in the background).
    """

    def __init__(
        self,
        text: str,
        path: str = "<string>",
        *,
        pipeline: Pipeline | None = None,
        debounce_s: float = 0.4,
        timer: TimerFactory = default_timer,
        export_dir: str | os.PathLike[str] = "spindle-export",
        max_devices: int = DEFAULT_MAX_DEVICES,
        follow: bool = True,
        **kwargs: Any,
    ) -> None:
        if pipeline is None:
            from spindle_dsl.widgets.pipeline import real_pipeline

            pipeline = real_pipeline()
        self._syncing = False
        self._lock = threading.RLock()  # the session, between a handler and a search's return
        self._follower = (  # (``follow=False``: the quick plans alone, as on a busy machine)
            Follower(pipeline.refine, pipeline.abandon_refine)
            if follow and pipeline.refine
            else None
        )
        self._weights_for: tuple[str | None, tuple[str, ...]] | None = None
        self._weight_sliders: dict[str, w.FloatSlider] = {}
        self.session = PlanningSession(
            pipeline, Settings(text=text, path=path, scheduler=pipeline.schedulers[0])
        )
        controls = self._controls(text, pipeline.schedulers, max_devices)
        outputs = self._outputs()
        export = self._export_row(export_dir)
        self._debouncer = Debouncer(self._on_text, debounce_s, timer)
        self._observe()
        title = w.HTML(
            f"<style>{CSS}</style><h3 style='margin:0'>Spindle planner: {escape(path)}</h3>"
        )
        super().__init__([title, w.HBox([controls, outputs]), self.status, export], **kwargs)
        self._show(self.session.view)
        self._follow()

    # --- building the view -----------------------------------------------------------------
    def _controls(self, text: str, schedulers: tuple[str, ...], max_devices: int) -> w.VBox:
        """The left column: cluster, scheduler, time, memory check, mix weights, spec."""
        wide = w.Layout(width="100%")
        self.devices = w.IntSlider(
            value=1,
            min=1,
            max=max_devices,
            description="devices",
            continuous_update=False,
            layout=wide,
        )
        self.devices.add_class("spindle-devices")
        self.device = w.Dropdown(
            options=[p.name for p in PRESETS.values()], description="device", layout=wide
        )
        self.scheduler = w.Dropdown(
            options=list(schedulers), value=schedulers[0], description="scheduler", layout=wide
        )
        self.time_limit = w.FloatLogSlider(
            value=INTERACTIVE_TIME_LIMIT_S,
            base=10,
            min=-2,
            max=1,
            step=0.1,
            description="plan time s",
            continuous_update=False,
            readout_format=".2g",
            tooltip="more time can find a better plan; re-planning waits for it",
            layout=wide,
        )
        self.check_memory = w.Checkbox(
            value=True,
            description="only plans that fit in memory",
            indent=False,
            tooltip="untick to see the fastest plan even where it overflows device memory",
        )
        self.mix = w.Dropdown(options=[], description="mix", layout=wide)
        self.weights = w.VBox([])
        self.spec_text = w.Textarea(
            value=text, continuous_update=True, layout=w.Layout(width="100%", height="320px")
        )
        self.spec_text.add_class("spindle-spec")
        self.errors = _html("spindle-errors")
        self.status = _html("spindle-status")
        return w.VBox(
            [
                self.devices,
                self.device,
                self.scheduler,
                self.time_limit,
                self.check_memory,
                self.mix,
                w.HTML("<b>task weights</b>"),
                self.weights,
                w.HTML("<b>spec</b> (errors show below as you type)"),
                self.spec_text,
                self.errors,
            ],
            layout=w.Layout(width="38%", min_width="320px"),
        )

    def _outputs(self) -> w.VBox:
        """The right column: summary, phases, waves, timeline, memory per device."""
        self.summary = _html("spindle-summary")
        self.phases = _html("spindle-phases")
        self.waves = _html("spindle-waves")
        self.timeline = _html("spindle-timeline")
        self.memory = _html("spindle-memory")
        return w.VBox(
            [
                self.summary,
                self.phases,
                w.HTML("<b>waves</b>"),
                self.waves,
                w.HTML("<b>timeline</b>"),
                self.timeline,
                w.HTML("<b>memory per device</b>"),
                self.memory,
            ],
            layout=w.Layout(width="62%", overflow="auto"),
        )

    def _export_row(self, export_dir: str | os.PathLike[str]) -> w.HBox:
        """The folder and the one-click export underneath."""
        self.export_dir = w.Text(value=str(export_dir), description="folder")
        self.export_dir.add_class("spindle-export-dir")
        self.export_button = w.Button(description="Export plan, trace, report", icon="download")
        self.export_button.add_class("spindle-export-button")
        self.export_button.on_click(lambda _b: self.export())
        self.export_status = _html("spindle-export-status")
        return w.HBox([self.export_dir, self.export_button, self.export_status])

    def _observe(self) -> None:
        """Each control re-plans (the spec text after a pause, ``Debouncer``)."""
        self.devices.observe(self._on_devices, "value")
        self.device.observe(self._on_device, "value")
        self.scheduler.observe(lambda ch: self._apply(scheduler=ch["new"]), "value")
        self.mix.observe(self._on_mix, "value")
        self.check_memory.observe(lambda ch: self._apply(check_memory=ch["new"]), "value")
        self.time_limit.observe(lambda ch: self._apply(time_limit_s=ch["new"]), "value")
        self.spec_text.observe(lambda _ch: self._debouncer.trigger(), "value")

    # --- constructors -----------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **kwargs: Any) -> PlannerWidget:
        return cls(read_spec(path), str(path), **kwargs)

    @classmethod
    def from_text(cls, text: str, path: str = "<string>", **kwargs: Any) -> PlannerWidget:
        return cls(text, path, **kwargs)

    # --- what the user sees -----------------------------------------------------------------
    @property
    def view(self) -> View:
        return self.session.view

    @property
    def plan(self):  # -> Plan | None
        """The plan the outputs show (the last good one while the spec is broken)."""
        return self.view.result.plan if self.view.result else None

    def flush(self) -> None:
        """Re-plan now for text typed within the debounce window (tests, scripts)."""
        self._debouncer.flush()

    def wait_full(self, timeout_s: float = 60.0) -> bool:
        """Wait for the full search behind the plan shown (scripts, tests); False on
        timeout. Within a kernel its plan arrives through the kernel's loop, after this."""
        return self._follower is None or self._follower.wait(timeout_s)

    def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
        super().close()

    def set_weights(self, **weights: float) -> None:
        """Set task weights as the sliders would (one re-plan for all of them)."""
        self._syncing = True
        try:
            for task, value in weights.items():
                self._weight_sliders[task].value = value
        finally:
            self._syncing = False
        self._on_weight(None)

    # --- control handlers -------------------------------------------------------------------
    def _on_devices(self, change: dict[str, Any]) -> None:
        self._apply(devices=change["new"])

    def _on_device(self, change: dict[str, Any]) -> None:
        self._apply(device=change["new"])

    def _on_mix(self, change: dict[str, Any]) -> None:
        if change["new"] is not None:
            self._apply(mix=change["new"])

    def _on_weight(self, _change: dict[str, Any] | None) -> None:
        self._apply(weights={t: s.value for t, s in self._weight_sliders.items()})

    def _on_text(self) -> None:
        self._apply(text=self.spec_text.value)

    def _apply(self, **changes: Any) -> None:
        if self._syncing:
            return
        with self._lock:
            if self._follower is not None:
                self._follower.cancel()  # (its plan is for settings no longer shown)
            try:
                view = self.session.update(**changes)
            except SpindleError as exc:  # a setting the session rejected outright
                self.errors.value = _error_html(exc.render())
                return
            except Exception as exc:  # a bug in a stage: keep the widget alive and say so
                log.exception("planning failed")
                self.errors.value = _error_html(
                    f"internal error (please report it): {type(exc).__name__}: {exc}\n"
                    "the outputs still show the last good plan"
                )
                return
            self._show(view)
            self._follow()

    def _follow(self) -> None:
        """Start the full search behind the plan shown, where it may improve it."""
        refinement = self.session.refinement()
        if refinement is None or self._follower is None:
            return
        self._follower.follow(refinement, self._adopt)
        self.status.value = _status_html(self.view, searching=True)

    def _adopt(self, refinement: Refinement, plan: Plan) -> None:
        """Show the full search's plan where it is quicker and its settings still shown."""
        with self._lock:
            view = self.session.adopt(refinement, plan)
            if view is not None:
                self._show(view)

    # --- redraw -------------------------------------------------------------------------------
    def _show(self, view: View) -> None:
        self.errors.value = _error_html(view.error, view.error_lines) if view.error else ""
        result = view.result
        if result is None:
            self.summary.value = "<i>no plan yet: fix the errors in the spec</i>"
            self.waves.value = self.timeline.value = self.memory.value = ""
            self.phases.value = self.status.value = ""
            return
        self.summary.value = summary_html(summarize(result.plan), stale=view.stale) + (
            _warnings_html(result.warnings) if not view.stale else ""
        )
        self.phases.value = (
            "<b>phases</b> (the schedule; the plan below is the first phase's, pick another "
            f"mix to see its plan)<br>{result.pictures.phases}"
            if result.pictures.phases
            else ""
        )
        self.waves.value = result.pictures.waves
        self.timeline.value = result.pictures.timeline
        self.memory.value = result.pictures.memory
        self.status.value = _status_html(view)
        if not view.stale:
            self._sync_controls(result)

    def _sync_controls(self, result: Result) -> None:
        """Make controls the user has not touched follow what the spec says."""
        self._syncing = True
        try:
            cluster = result.graph.cluster
            if self.devices.max < cluster.devices:
                self.devices.max = cluster.devices
            self.devices.value = cluster.devices
            name = cluster.device.name
            if name in self.device.options:
                self.device.value = name
            names = [m.name for m in result.mixes]
            if list(self.mix.options) != names:
                self.mix.options = names
            base = _base_mix(result)
            self.mix.value = base.name if base else None
            self._sync_weights(result, base)
        finally:
            self._syncing = False

    def _sync_weights(self, result: Result, base: MixInfo | None) -> None:
        tasks = tuple(t.name for t in result.graph.tasks)
        key = (base.name if base else None, tasks)
        overrides = dict(result.settings.weights)
        if key != self._weights_for:
            for s in self._weight_sliders.values():
                s.unobserve(self._on_weight, "value")
            self._weight_sliders = {}
            if base is not None:
                values = [*(wt for _t, wt in base.weights), *overrides.values()]
                step = _slider_step(values)
                # weights are relative: twice the largest one is room enough to let any task
                # dominate the mix
                top = step * math.ceil(2 * max([*values, step]) / step)
                for task in tasks:
                    s = w.FloatSlider(
                        value=overrides.get(task, base.weight(task)),
                        min=0.0,
                        max=top,
                        step=step,
                        description=task,
                        continuous_update=False,
                        style={"description_width": "initial"},
                        layout=w.Layout(width="100%"),
                    )
                    s.observe(self._on_weight, "value")
                    self._weight_sliders[task] = s
            self.weights.children = tuple(self._weight_sliders.values())
            self._weights_for = key
        for task, s in self._weight_sliders.items():
            s.value = overrides.get(task, base.weight(task) if base else 0.0)

    # --- export -------------------------------------------------------------------------------
    def export(self) -> None:
        """Write the shown plan's JSON, Chrome trace, HTML report and spec to the folder."""
        from spindle_dsl.widgets.export import export_result

        result = self.view.result
        if result is None:
            self.export_status.value = _error_html("nothing to export: there is no plan yet")
            return
        try:
            written = export_result(result, self.export_dir.value)
        except SpindleError as exc:
            self.export_status.value = _error_html(exc.render())
            return
        note = " (the last good plan)" if self.view.stale else ""
        items = "".join(f"<li><code>{escape(str(p))}</code></li>" for p in written.paths)
        self.export_status.value = f"wrote{note}:<ul style='margin:0'>{items}</ul>"
        self.last_export = written


def _slider_step(values: list[float]) -> float:
    """A decimal step that every declared weight is a multiple of, one digit finer.

    The browser snaps a slider's value to its step; a step that did not divide the declared
    weights would move the sliders (and re-plan) as soon as the page shows them.
    """
    for digits in range(7):
        if all(abs(v * 10**digits - round(v * 10**digits)) < 1e-6 for v in values):
            return 10.0 ** -(digits + 1)
    return 1e-7


def _base_mix(result: Result) -> MixInfo | None:
    """The declared mix the weight sliders start from (the selected one, else the first)."""
    if not result.mixes:
        return None
    want = result.settings.mix
    for m in result.mixes:
        if m.name == want:
            return m
    return result.mixes[0]


PRE = "margin:0;white-space:pre-wrap;font-family:monospace"  # diagnostics keep their carets


def _error_html(text: str, lines: tuple[int, ...] = ()) -> str:
    where = f"<div>errors on line {', '.join(map(str, lines))}</div>" if lines else ""
    return (
        f"<div style='color:#b00'>{where}<pre style='{PRE}'>{escape(text, quote=False)}</pre></div>"
    )


def _warnings_html(warnings: tuple[str, ...]) -> str:
    if not warnings:
        return ""
    body = escape("\n".join(warnings), quote=False)
    return (
        f"<pre style='color:#a60;margin:0;white-space:pre-wrap;font-family:monospace'>{body}</pre>"
    )


def _status_html(view: View, *, searching: bool = False) -> str:
    t = view.timings
    if view.full_search:
        said = "the full search's plan" + (" (from cache)" if view.cached else "")
    elif view.cached:
        said = "re-planned from cache"
    else:
        said = (
            f"re-planned in {1e3 * t.total_s:.0f} ms (compile {1e3 * t.compile_s:.0f}, "
            f"plan {1e3 * t.plan_s:.0f}, draw {1e3 * t.draw_s:.0f})"
        )
    return f"<small>{said}{'; searching further in the background' if searching else ''}</small>"
