"""MetaOps with their curves as plan-format records (``shared/docs/plan-format.md``).

``spindle curves --json`` and anything else that publishes curves write the same fields a plan
file's ``metaops`` array holds, so tools that read plans read these too.
"""

from __future__ import annotations

from typing import Any

from spindle_dsl.cost.base import Curve, Curves
from spindle_dsl.metagraph import MetaGraph, MetaOp


def metaop_record(op: MetaOp, curve: Curve) -> dict[str, Any]:
    """One entry of a plan's ``metaops`` array."""
    return {
        "id": op.id,
        "task": op.task,
        "module": op.module,
        "kind": op.kind,
        "layers": op.layers,
        "batch": op.batch,
        "tokens": op.tokens,
        "deps": list(op.deps),
        "forward_flops_per_layer": op.forward_flops_per_layer,
        "param_bytes_per_layer": op.param_bytes_per_layer,
        "seconds_per_layer": {str(n): s for n, s in curve.items()},
    }


def curves_document(graph: MetaGraph, curves: Curves) -> dict[str, Any]:
    """``{"source", "cluster", "metaops"}``: the curves of every MetaOp of ``graph``."""
    c = graph.cluster
    return {
        "source": curves.source,
        "cluster": {
            "devices": c.devices,
            "device": c.device.name,
            "devices_per_node": c.devices_per_node,
            "memory_bytes": c.device.memory_bytes,
        },
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
