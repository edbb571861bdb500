"""Seeing the plan: pictures of a MetaGraph and a wave plan, a Chrome trace, an HTML report.

Public functions (importing this package is cheap: each is loaded on first use, so nothing
pulls in matplotlib until a timeline is drawn):

- ``metagraph_dot(graph_or_plan)`` and ``waves_dot(plan)``: ``graphviz.Digraph`` objects;
  ``render_dot(dot, "svg"|"png"|"pdf")`` runs Graphviz's ``dot`` (``DotMissingError`` says how
  to install it); ``dot_available()`` tells whether it is there.
- ``timeline_bytes(plan, "svg"|"png"|"pdf")``: devices down, time across (matplotlib).
- ``plan_trace(plan)``, ``chrome_trace(spans, flows)``, ``write_trace``, ``check_trace``, and the
  ``Span``/``Flow``/``FlowEnd`` values: Chrome trace JSON for predicted and measured runs.
- ``build_report(plan, graph=None)`` / ``write_report(path, plan, graph=None)``: one
  self-contained HTML page; ``build_bundle_report(bundle, graphs=None)`` for a schedule's
  plans, with ``phases_svg(bundle)``, the phases on a timeline of training steps.
- ``metagraph_text``, ``waves_text``, ``timeline_text``: the same pictures as plain text.
- ``palette(tasks)`` / ``plan_palette(plan)``: the per-task colours every picture shares.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "metagraph_dot": "dot_metagraph",
    "graph_view": "dot_metagraph",
    "waves_dot": "dot_waves",
    "render_dot": "graphviz_tools",
    "dot_available": "graphviz_tools",
    "write_dot_picture": "graphviz_tools",
    "DotMissingError": "graphviz_tools",
    "timeline_bytes": "timeline",
    "timeline_figure": "timeline",
    "plan_trace": "trace",
    "plan_spans": "trace",
    "chrome_trace": "trace",
    "write_trace": "trace",
    "check_trace": "trace",
    "Span": "trace",
    "Flow": "trace",
    "FlowEnd": "trace",
    "build_report": "report",
    "write_report": "report",
    "build_bundle_report": "report",
    "phases_svg": "phases",
    "metagraph_text": "text",
    "waves_text": "text",
    "timeline_text": "text",
    "palette": "colors",
    "plan_palette": "schedule",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'spindle_dsl.render' has no attribute '{name}'")
    return getattr(importlib.import_module(f"spindle_dsl.render.{_WHERE[name]}"), name)
