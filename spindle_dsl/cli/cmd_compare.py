"""``spindle compare PLAN.json TRACE.json``: the plan's prediction against a measured run.

TRACE.json is the measured Chrome trace ``spindle train --plan PLAN.json --trace TRACE.json``
wrote. Prints, per step term, per wave and per MetaOp, the predicted and the measured seconds
per step (medians over the steps after the first, the slowest rank's), largest miss first;
``--json`` prints the same rows as JSON.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN.json", help="the plan the run executed")
    parser.add_argument("trace", metavar="TRACE.json", help="its measured trace (train --trace)")
    parser.add_argument("--top", type=int, metavar="N", help="show only the N largest misses")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.errors import SpindleError
    from spindle_dsl.plan.model import Plan
    from spindle_dsl.render.compare import compare, compare_table
    from spindle_dsl.render.measured import load_trace, read_measured

    if args.top is not None and args.top < 1:
        raise SpindleError(f"--top must be at least 1, got {args.top}")
    plan = Plan.read(args.plan)
    measured = read_measured(load_trace(args.trace), where=args.trace)
    rows = compare(plan, measured)
    if args.json:
        shown = rows if args.top is None else rows[: args.top + 1]
        print(json.dumps({"steps": list(measured.kept), "rows": [r.to_dict() for r in shown]},
                         indent=1))  # fmt: skip
        return 0
    print(
        f"{args.plan} against {args.trace}: medians of steps "
        f"{measured.kept[0]}..{measured.kept[-1]}, the slowest rank's"
    )
    print(compare_table(rows, args.top))
    return 0
