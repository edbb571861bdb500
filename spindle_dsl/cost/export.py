"""MetaOps with their curves as plan-format records (``shared/docs/plan-format.md``).

``spindle curves --json`` and anything else that publishes curves write the same fields a plan
file's ``metaops`` array holds, so tools that read plans read these too.
"""

from __future__ import annotations

from typing import Any

from spindle_dsl.cost.base import Curve, Curves
from spindle_dsl.metagraph import MetaGraph, MetaOp
from spindle_dsl.plan.model import ClusterRef, PlanMetaOp


def metaop_record(op: MetaOp, curve: Curve) -> dict[str, Any]:
    """One entry of a plan's ``metaops`` array."""
    return PlanMetaOp.of(op, tuple(curve.items())).to_dict()


def curves_document(graph: MetaGraph, curves: Curves) -> dict[str, Any]:
    """``{"source", "cluster", "metaops"}``: the curves of every MetaOp of ``graph``."""
    return {
        "source": curves.source,
        "cluster": ClusterRef.of(graph.cluster).to_dict(),
        "metaops": [metaop_record(op, curves[op.id]) for op in graph.metaops],
    }


def add_curve_fields(rows: list[dict[str, Any]], curves: Curves, devices: int) -> None:
    """Add ``t1_s``, ``tN_s`` and ``speedup`` (T(1) / T(N)) to summary rows keyed by ``id``.

    ``spindle check`` shows these beside each MetaOp so a user sees at once which MetaOps
    scale and which do not, before planning.
    """
    for row in rows:
        curve = curves[row["id"]]
        t1, tn = curve.at(1), curve.at(devices)
        row.update(t1_s=t1, tN_s=tn, speedup=t1 / tn)
