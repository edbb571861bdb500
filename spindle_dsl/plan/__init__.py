"""The wave plan: values, JSON form (format version 1) and invariant checks."""

from spindle_dsl.plan.model import (
    ClusterRef,
    Entry,
    Plan,
    PlanMetaOp,
    SolverInfo,
    SpecRef,
    Wave,
)

__all__ = [
    "ClusterRef",
    "Entry",
    "Plan",
    "PlanMetaOp",
    "SolverInfo",
    "SpecRef",
    "Wave",
]
