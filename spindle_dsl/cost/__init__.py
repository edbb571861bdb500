"""Cost models: T_m(n) curves, memory and communication prices for the planner."""

from __future__ import annotations

import os

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost.base import CostModel, Curve, Curves


def make_cost_model(
    cluster: Cluster, profile: str | os.PathLike[str] | object | None = None
) -> CostModel:
    """The analytic model, or the one fitted to ``profile`` (a path to a profile JSON written
    by ``spindle profile``, or a loaded ``Profile``). A bad profile file raises SpindleError."""
    from spindle_dsl.cost.analytic import AnalyticCostModel

    if profile is None:
        return AnalyticCostModel(cluster)
    from spindle_dsl.cost.profile import Profile, ProfiledCostModel

    if isinstance(profile, Profile):
        return ProfiledCostModel(cluster, profile)
    return ProfiledCostModel(cluster, Profile.read(profile), source=os.fspath(profile))  # type: ignore[arg-type]


__all__ = ["CostModel", "Curve", "Curves", "make_cost_model"]
