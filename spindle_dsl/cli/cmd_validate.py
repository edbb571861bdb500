"""``spindle validate PLAN.json``: check a plan file against the plan format's invariants.

Exits 0 and says so when every invariant holds; exits 1 listing each broken invariant (a
malformed file is reported the same way, as a ``PlanFormatError``). A plan bundle (a plan per
phase of a schedule, ``docs/plan-bundle.md``) is checked as a bundle and phase by phase.
"""

from __future__ import annotations

import argparse
import sys

from spindle_dsl.plan.bundle import PlanBundle, read_plan_file, validate_bundle
from spindle_dsl.plan.validate import validate_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "plan", metavar="PLAN.json", help="a plan (or plan bundle) written by `spindle plan`"
    )


def run(args: argparse.Namespace) -> int:
    plan = read_plan_file(args.plan)
    errors = validate_bundle(plan) if isinstance(plan, PlanBundle) else validate_plan(plan)
    if errors:
        for e in errors:
            print(f"{args.plan}: error: {e}", file=sys.stderr)
        print(f"{args.plan}: {len(errors)} broken invariant(s)", file=sys.stderr)
        return 1
    if isinstance(plan, PlanBundle):
        first = plan.phases[0].plan
        print(
            f"{args.plan}: valid bundle ({len(plan.phases)} phases: "
            + ", ".join(f"{p.mix} from step {p.first_step}" for p in plan.phases)
            + f"; {first.cluster.devices} devices)"
        )
        return 0
    print(
        f"{args.plan}: valid ({len(plan.metaops)} MetaOps, {len(plan.waves)} waves, "
        f"{plan.cluster.devices} devices)"
    )
    return 0
