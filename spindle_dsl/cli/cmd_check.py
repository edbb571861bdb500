"""``spindle check SPEC``: parse, check and lower a spec, then show what the planner will see.

Errors and warnings go to stderr in compiler form (exit 1 on any error); the summary (tasks,
modules with parameter counts, MetaOps with L, batch, tokens and GFLOPs per iteration) goes to
stdout, as a table or, with ``--json``, as data for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys

from spindle_dsl.cli.common import add_spec_arguments, cluster_overrides


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.language import compile_file
    from spindle_dsl.language.summary import render_summary, summarize

    compiled = compile_file(args.spec, mix=args.mix, cluster_overrides=cluster_overrides(args))
    if compiled.warnings:
        print(compiled.render_warnings(), file=sys.stderr)
    warnings = [w.render(compiled.spec.source) for w in compiled.warnings]
    data = summarize(compiled.graph, warnings, compiled.schedule, compiled.train)
    text = None if args.json else render_summary(data)
    text = _add_curves(args, compiled.graph, data, text)
    print(json.dumps(data, indent=2) if args.json else text)
    return 0


def _add_curves(args: argparse.Namespace, graph, data: dict, text: str | None) -> str | None:
    """T_m(1), T_m(N) and the speed-up per MetaOp (analytic, or ``--profile``): added to the
    JSON rows, and as extra columns of the MetaOp table (the summary's last section)."""
    from spindle_dsl.cli.cmd_curves import format_seconds
    from spindle_dsl.cli.common import load_cost_model
    from spindle_dsl.cost.export import add_curve_fields
    from spindle_dsl.language.summary import METAOP_COLUMNS, render_table

    n = graph.cluster.devices
    curves = load_cost_model(args, graph).curves(graph)
    add_curve_fields(data["metaops"], curves, n)
    data["curves"] = {"source": curves.source, "devices": n}
    if text is None:
        return None
    columns = [
        *METAOP_COLUMNS,
        ("t1_s", "T(1)/layer", format_seconds),
        ("tN_s", f"T({n})/layer", format_seconds),
        ("speedup", "speedup", lambda x: f"{x:.1f}x"),
    ]
    plain = render_table(data["metaops"], METAOP_COLUMNS)
    wide = render_table(data["metaops"], columns)
    if text.endswith(plain):
        return text[: -len(plain)] + wide + f"\n(T: one layer forward+backward, {curves.source})"
    return text + "\n\n" + wide
