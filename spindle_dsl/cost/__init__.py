"""Cost models: T_m(n) curves, memory and communication prices for the planner."""

from __future__ import annotations

import os

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost.base import CostModel, Curve, Curves


def make_cost_model(
    cluster: Cluster,
    profile: str | os.PathLike[str] | object | None = None,
    tp: int | None = None,
) -> CostModel:
    """The analytic model, or the one fitted to ``profile`` (a path to a profile JSON written
    by ``spindle profile``, or a loaded ``Profile``). A bad profile file raises SpindleError.
    ``tp``: the tensor-parallel degree every entry whose kind splits into it runs on at least
    that many devices (``--tp``; 1: data parallel only; None: the model chooses)."""
    from spindle_dsl.cost.analytic import AnalyticCostModel

    if profile is None:
        return AnalyticCostModel(cluster, tp)
    from spindle_dsl.cost.profile import Profile, ProfiledCostModel

    if not isinstance(profile, Profile):
        source = os.fspath(profile)  # type: ignore[arg-type]
        return ProfiledCostModel(cluster, Profile.read(source), source=source, tp=tp)
    return ProfiledCostModel(cluster, profile, tp=tp)


__all__ = ["CostModel", "Curve", "Curves", "make_cost_model"]
