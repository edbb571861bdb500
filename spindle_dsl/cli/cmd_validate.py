"""``spindle validate PLAN.json``: check a plan file against the plan format's invariants.

Exits 0 and says so when every invariant holds; exits 1 listing each broken invariant (a
malformed file is reported the same way, as a ``PlanFormatError``).
"""

from __future__ import annotations

import argparse
import sys

from spindle_dsl.plan.model import Plan
from spindle_dsl.plan.validate import validate_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN.json", help="a plan written by `spindle plan`")


def run(args: argparse.Namespace) -> int:
    plan = Plan.read(args.plan)
    errors = validate_plan(plan)
    if errors:
        for e in errors:
            print(f"{args.plan}: error: {e}", file=sys.stderr)
        print(f"{args.plan}: {len(errors)} broken invariant(s)", file=sys.stderr)
        return 1
    print(
        f"{args.plan}: valid ({len(plan.metaops)} MetaOps, {len(plan.waves)} waves, "
        f"{plan.cluster.devices} devices)"
    )
    return 0
