"""MetaGraph and Plan display themselves in Jupyter (driven without a kernel)."""

from __future__ import annotations

import pytest


@pytest.mark.needs_dot
def test_metagraph_displays_as_svg(graph):
    bundle = graph._repr_mimebundle_()
    assert bundle["image/svg+xml"].lstrip().startswith("<?xml")
    assert "task caption" in bundle["text/plain"]


def test_metagraph_without_dot_explains_and_lists(graph, no_dot):
    bundle = graph._repr_mimebundle_()
    assert "image/svg+xml" not in bundle
    assert "not installed" in bundle["text/html"] and "vision_proj" in bundle["text/html"]


def test_plan_displays_its_timeline(plan, no_dot):
    bundle = plan._repr_mimebundle_()
    assert "<svg" in bundle["image/svg+xml"]
    assert "data:image/svg+xml;base64," in bundle["text/html"]
    assert bundle["text/plain"].startswith("hand/tiny.spindle")


def test_include_and_exclude(plan, no_dot):
    assert set(plan._repr_mimebundle_(include=["text/plain"])) == {"text/plain"}
    assert "text/html" not in plan._repr_mimebundle_(exclude=["text/html"])


def test_ipython_formatter_uses_the_bundle(plan, no_dot):
    ipython = pytest.importorskip("IPython.core.formatters")
    data, _ = ipython.DisplayFormatter().format(plan)
    assert "image/svg+xml" in data and "text/html" in data
