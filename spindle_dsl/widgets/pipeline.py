"""The real stages behind a planning session: language, cost model, planner, pictures.

Kept apart from ``state.py`` so the session logic depends on nothing but plain functions, and
so this is the one place that knows which library calls the widget makes. Pictures are embedded
as ``data:`` URIs in ``<img>`` tags: each SVG stays its own document, so the element ids that
Graphviz and matplotlib write cannot collide when several pictures share one page.

The timeline and the memory chart are hand-written SVG (``timeline_svg``, ``memory_svg``) rather
than matplotlib figures: they are redrawn on every slider move, and matplotlib alone would take
most of the half second a re-plan may cost. The wave picture is Graphviz's, as everywhere.

The full search that follows a quick plan (``follow.py``) runs in a process of its own
(``REFINE_CHANNEL``, one of the planner's worker processes): planning is pure Python, and in
the kernel's process it would hold the interpreter lock the widgets' messages need. It is the
planner's own full search, helper processes and all (the plan ``spindle plan`` prints), in a
fresh process each time: the next slider move ends it and them (``isolate.abandon``) before
planning, and so does its answer, as its helpers may still be on rounds the plan did not wait
for, which would slow the next move's plan.
"""

from __future__ import annotations

import base64
from html import escape
from typing import Any

from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan
from spindle_dsl.widgets.memory_svg import memory_svg
from spindle_dsl.widgets.mixes import MixInfo
from spindle_dsl.widgets.state import Compiled, Pictures, Pipeline, PlanOptions
from spindle_dsl.widgets.timeline_svg import timeline_svg

REFINE_CHANNEL = "widget-refine"


def mixes_of(spec: Any) -> tuple[MixInfo, ...]:
    """Every mix a checked spec declares, as the weight sliders need them."""
    out = []
    for decl in spec.mixes:
        batch = 0
        weights: list[tuple[str, float]] = []
        for s in decl.settings:
            if s.key.name == "global_batch":
                batch = int(s.value.value)
            else:
                weights.append((s.key.name, float(s.value.value)))
        out.append(MixInfo(decl.name.name, batch, tuple(weights)))
    return tuple(out)


def img(svg: bytes | str, alt: str) -> str:
    """An SVG as a self-contained ``<img>`` that scales to the output's width."""
    data = svg.encode() if isinstance(svg, str) else svg
    b64 = base64.b64encode(data).decode("ascii")
    return (
        f'<img alt="{escape(alt)}" style="max-width:100%;height:auto" '
        f'src="data:image/svg+xml;base64,{b64}">'
    )


def draw(plan: Plan, graph: MetaGraph) -> Pictures:
    """The three pictures of a plan. Without Graphviz the waves are listed as text."""
    from spindle_dsl.render.dot_waves import waves_dot
    from spindle_dsl.render.graphviz_tools import INSTALL_HINT, dot_available, render_dot
    from spindle_dsl.render.schedule import plan_palette
    from spindle_dsl.render.text import waves_text

    colours = plan_palette(plan)
    if dot_available():
        waves = img(render_dot(waves_dot(plan, colours), "svg", "the wave plan"), "wave plan")
    else:
        waves = (
            f"<p>The Graphviz <code>dot</code> program is not installed, so the waves are "
            f"listed as text. {escape(INSTALL_HINT)}.</p><pre>{escape(waves_text(plan))}</pre>"
        )
    timeline = img(timeline_svg(plan, colours), "timeline")
    return Pictures(waves=waves, timeline=timeline, memory=memory_svg(plan))


def draw_phases(bundle) -> str:  # PlanBundle -> markup
    """A schedule's phases on a timeline of training steps (``render.phases``)."""
    from spindle_dsl.render.phases import phases_svg

    return img(phases_svg(bundle), "phases")


def plan_with(graph: MetaGraph, options: PlanOptions, profile: str | None) -> Plan:
    """The planner's plan of ``graph`` under ``options``: a quick plan here, the full search's
    in the refine process (a module-level function, so that process can load it)."""
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.planner import make_plan

    return make_plan(
        graph,
        make_cost_model(graph.cluster, profile=profile),
        scheduler=options.scheduler,
        time_limit_s=options.time_limit_s,
        check_memory=options.check_memory,
    )


def real_pipeline(*, profile: str | None = None) -> Pipeline:
    """The library's own stages; ``profile`` is a `spindle profile` file to fit curves from."""
    from spindle_dsl.language import compile_text
    from spindle_dsl.planner import SCHEDULERS
    from spindle_dsl.planner.solver import isolate

    def compile_(text: str, path: str, mix: str | None, overrides: dict[str, Any]) -> Compiled:
        c = compile_text(text, path, mix=mix, cluster_overrides=overrides)
        warnings = tuple(d.render(text) for d in c.warnings)
        phases = tuple((p.first_step, p.mix) for p in c.schedule.phases) if c.schedule else ()
        return Compiled(c.graph, warnings, mixes_of(c.spec), phases)

    def plan_(graph: MetaGraph, options: PlanOptions) -> Plan:
        return plan_with(graph, options, profile)

    def refine(graph: MetaGraph, options: PlanOptions) -> Plan:
        timeout = 2 * options.time_limit_s + isolate.START_TIMEOUT_S
        try:
            return isolate.call(plan_with, (graph, options, profile), timeout, REFINE_CHANNEL)
        finally:  # (its helpers may still be on rounds the plan did not wait for)
            isolate.abandon(REFINE_CHANNEL)

    names = tuple(SCHEDULERS)
    ordered = ("default", *(n for n in names if n != "default")) if "default" in names else names
    return Pipeline(
        compile_,
        plan_,
        draw,
        ordered,
        draw_phases,
        refine=refine,
        abandon_refine=lambda: isolate.abandon(REFINE_CHANNEL),
    )
