"""``spindle curves SPEC``: every MetaOp's time curve T_m(n) as a table, or as JSON.

The table shows one row per MetaOp and a column per device count (powers of two and the
cluster size, or the counts given with ``--n``), plus the speed-up T(1)/T(N). ``--json`` prints
``{"source", "cluster", "metaops"}`` where ``metaops`` holds exactly the records of a plan file's
``metaops`` array (shared/docs/plan-format.md), ``seconds_per_layer`` for every n included.
"""

from __future__ import annotations

import argparse
import json

from spindle_dsl.cli.common import add_spec_arguments, load_cost_model, load_graph
from spindle_dsl.errors import SpindleError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print plan-format metaops records")
    parser.add_argument(
        "--n",
        metavar="N[,N...]",
        help="device counts to show as columns (default: powers of two and the cluster size)",
    )


def format_seconds(seconds: float) -> str:
    """Three significant digits in the unit that keeps the number readable."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale or unit == "us":
            return f"{seconds / scale:.3g} {unit}"
    raise AssertionError("unreachable")


def default_columns(devices: int) -> list[int]:
    cols, n = [], 1
    while n < devices:
        cols.append(n)
        n *= 2
    return [*cols, devices]


def parse_columns(text: str | None, devices: int) -> list[int]:
    if not text:
        return default_columns(devices)
    try:
        cols = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise SpindleError(f"--n wants comma-separated device counts, got '{text}'") from None
    bad = [n for n in cols if not 1 <= n <= devices]
    if bad or not cols:
        raise SpindleError(f"--n: device counts must lie in 1..{devices}, got {text}")
    return cols


def render_table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-align the first column, right-align the rest."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.cost.export import curves_document

    graph = load_graph(args)
    cost = load_cost_model(args, graph)
    curves = cost.curves(graph)
    cluster = graph.cluster
    if args.json:
        print(json.dumps(curves_document(graph, curves), indent=1))
        return 0
    cols = parse_columns(args.n, cluster.devices)
    headers = ["metaop", "kind", "L", "batch", "tokens", *(f"T({n})" for n in cols), "speedup"]
    rows = []
    for op in graph.metaops:
        curve = curves[op.id]
        speedup = curve.at(1) / curve.at(cluster.devices)
        rows.append(
            [op.id, op.kind, str(op.layers), str(op.batch), str(op.tokens)]
            + [format_seconds(curve.at(n)) if curve.lists(n) else "-" for n in cols]
            + [f"{speedup:.1f}x"]
        )
    print(
        f"T_m(n): seconds of one layer forward+backward on n devices ({curves.source}; "
        f"{cluster.devices} x {cluster.device.name}, {cluster.devices_per_node} per node); "
        f"speedup = T(1) / T({cluster.devices})"
    )
    print(render_table(headers, rows))
    if any("-" in r[5:-1] for r in rows):
        print(
            "-: not an allocation the planner lists for this MetaOp (curves list every n up to "
            "64, the steps of T(n), powers of two, divisors of the device count and whole "
            "nodes; `--json` has them all)"
        )
    return 0
