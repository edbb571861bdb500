"""Interactive planning in Jupyter: ``PlannerWidget`` and the kernel-free session behind it.

``PlanningSession`` (``state.py``) does the work and can be used from plain Python; the widget
(``planner_widget.py``, which needs ipywidgets) is imported only when asked for, so that
``import spindle_dsl.widgets`` works without the notebook extra installed.
"""

from __future__ import annotations

from typing import Any

from spindle_dsl.widgets.state import PlanningSession, Settings, View

__all__ = ["PlannerWidget", "PlanningSession", "Settings", "View"]


def __getattr__(name: str) -> Any:
    if name == "PlannerWidget":
        from spindle_dsl.widgets.planner_widget import PlannerWidget

        return PlannerWidget
    raise AttributeError(name)
