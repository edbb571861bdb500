"""How MetaGraph and Plan objects show themselves in Jupyter.

``MetaGraph._repr_mimebundle_`` and ``Plan._repr_mimebundle_`` call these lazily, so importing
the core types never imports graphviz or matplotlib. A MetaGraph shows its Graphviz picture
(or, without ``dot``, a note and its text listing); a Plan shows its headline figures above the
timeline, which needs no ``dot``. Every bundle has a ``text/plain`` fallback for consoles.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from html import escape
from typing import Any

from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan
from spindle_dsl.render.dot_metagraph import metagraph_dot
from spindle_dsl.render.dot_waves import plan_title
from spindle_dsl.render.graphviz_tools import INSTALL_HINT, dot_available, render_dot
from spindle_dsl.render.text import metagraph_text, waves_text
from spindle_dsl.render.timeline import timeline_bytes


def _select(
    bundle: dict[str, Any], include: Iterable[str] | None, exclude: Iterable[str] | None
) -> dict[str, Any]:
    """Honour IPython's include/exclude arguments."""
    if include is not None:
        keep = set(include)
        bundle = {k: v for k, v in bundle.items() if k in keep}
    if exclude is not None:
        drop = set(exclude)
        bundle = {k: v for k, v in bundle.items() if k not in drop}
    return bundle


def metagraph_mimebundle(
    graph: MetaGraph,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> dict[str, Any]:
    text = metagraph_text(graph)
    bundle: dict[str, Any] = {"text/plain": text}
    if dot_available():
        bundle["image/svg+xml"] = render_dot(metagraph_dot(graph), "svg", "the MetaGraph").decode()
    else:
        bundle["text/html"] = (
            "<p><b>The Graphviz <code>dot</code> program is not installed</b>, so the MetaGraph "
            f"is listed as text. {escape(INSTALL_HINT)}.</p><pre>{escape(text)}</pre>"
        )
    return _select(bundle, include, exclude)


def plan_mimebundle(
    plan: Plan,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> dict[str, Any]:
    svg = timeline_bytes(plan, "svg")
    b64 = base64.b64encode(svg).decode("ascii")
    html = (
        f"<p><b>{escape(plan_title(plan))}</b> · {len(plan.waves)} waves</p>"
        f'<img alt="timeline" style="max-width:100%" src="data:image/svg+xml;base64,{b64}">'
    )
    bundle = {"text/plain": waves_text(plan), "text/html": html, "image/svg+xml": svg.decode()}
    return _select(bundle, include, exclude)
