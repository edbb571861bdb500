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
    data = summarize(compiled.graph, [w.render(compiled.spec.source) for w in compiled.warnings])
    print(json.dumps(data, indent=2) if args.json else render_summary(data))
    return 0
