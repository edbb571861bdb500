"""Cost models: T_m(n) curves, memory and communication prices for the planner."""

from spindle_dsl.cost.base import CostModel, Curve, Curves

__all__ = ["CostModel", "Curve", "Curves"]
