"""``spindle render``: draw a MetaGraph, a wave plan, a timeline or a trace, from a plan file or
a spec. Without ``-o`` the picture is printed as text, so it can be looked at in a terminal.

Also home to the ``--svg``/``--trace`` options of ``spindle plan`` (``add_plan_outputs`` and
``write_plan_outputs``), so that every command writes pictures the same way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spindle_dsl.atomic import write_atomic
from spindle_dsl.cli.common import add_spec_arguments, load_cost_model, load_graph
from spindle_dsl.errors import SpindleError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan

WHATS = ("metagraph", "waves", "timeline", "trace")
FORMATS = ("svg", "png", "pdf", "dot", "txt", "json")
VALID = {
    "metagraph": ("svg", "png", "pdf", "dot", "txt"),
    "waves": ("svg", "png", "pdf", "dot", "txt"),
    "timeline": ("svg", "png", "pdf", "txt"),
    "trace": ("json",),
}


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """INPUT (a plan file or a spec) plus the spec options, used when INPUT is a spec."""
    add_spec_arguments(parser)
    for action in parser._actions:
        if action.dest == "spec":
            action.metavar = "PLAN.json|SPEC"
            action.help = "a plan written by `spindle plan --out`, or a .spindle file to plan"
    group = parser.add_argument_group("planning (when INPUT is a spec)")
    group.add_argument(
        "--scheduler", default="default", help="default, milp, paper or a baseline's name"
    )
    group.add_argument("--time-limit", type=float, metavar="S", help="planning time budget (s)")
    group.add_argument(
        "--no-memory-check",
        action="store_true",
        help="draw the fastest plan even if it overflows device memory (the memory chart and "
        "the notes show where)",
    )


def is_plan_file(path: str) -> bool:
    return Path(path).suffix.lower() == ".json"


def load_plan(args: argparse.Namespace) -> tuple[Plan, MetaGraph | None]:
    """The plan to draw: read from a plan file, or made from the spec (graph returned too)."""
    if is_plan_file(args.spec):
        from spindle_dsl.plan.bundle import PlanBundle, read_plan_file

        plan = read_plan_file(args.spec)
        if isinstance(plan, PlanBundle):
            raise SpindleError(
                f"{args.spec} is a plan bundle of {len(plan.phases)} phases: `spindle report "
                f"{args.spec}` shows them all; to draw one, take its plan out with "
                f"jq '.phases[K].plan' {args.spec} > phase.json (K from 0)"
            )
        return plan, None
    from spindle_dsl.planner import make_plan

    graph = load_graph(args)
    cost = load_cost_model(args, graph)
    limit = {} if args.time_limit is None else {"time_limit_s": args.time_limit}
    plan = make_plan(
        graph, cost, scheduler=args.scheduler, check_memory=not args.no_memory_check, **limit
    )
    return plan, graph


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser)
    parser.add_argument("--what", choices=WHATS, default="waves", help="what to draw")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help="output format (default: from -o's suffix; txt on the terminal without -o)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="where to write it")


def _format(args: argparse.Namespace) -> str:
    if args.format:
        fmt = args.format
    elif args.output:
        fmt = Path(args.output).suffix.lower().lstrip(".") or "txt"
        if fmt not in FORMATS:
            raise SpindleError(
                f"cannot tell the format from '{args.output}': give --format "
                f"({', '.join(VALID[args.what])})"
            )
    else:
        fmt = "json" if args.what == "trace" else "txt"
    if fmt not in VALID[args.what]:
        raise SpindleError(
            f"--what {args.what} can be written as {', '.join(VALID[args.what])}, not '{fmt}'"
            + (" (the timeline is drawn by matplotlib, not Graphviz)" if fmt == "dot" else "")
        )
    return fmt


def render(what: str, fmt: str, source: MetaGraph | Plan) -> bytes | str:
    """The picture as bytes or text, except DOT pictures in svg/png/pdf (see ``_write``)."""
    from spindle_dsl.render import text, timeline, trace

    if fmt == "txt":
        if what == "metagraph":
            return text.metagraph_text(source)
        assert isinstance(source, Plan)
        return text.waves_text(source) if what == "waves" else text.timeline_text(source)
    assert isinstance(source, Plan)
    if what == "timeline":
        return timeline.timeline_bytes(source, fmt)
    import json

    return json.dumps(trace.plan_trace(source), separators=(",", ":")) + "\n"


def _dot_graph(what: str, source: MetaGraph | Plan):
    from spindle_dsl.render.dot_metagraph import metagraph_dot
    from spindle_dsl.render.dot_waves import waves_dot

    if what == "metagraph":
        return metagraph_dot(source)
    assert isinstance(source, Plan)
    return waves_dot(source)


def write_picture(what: str, fmt: str, source: MetaGraph | Plan, path: Path) -> Path:
    """Write one picture; DOT pictures without ``dot`` leave their source and raise."""
    from spindle_dsl.render.graphviz_tools import write_dot_picture

    if what in ("metagraph", "waves") and fmt != "txt":
        return write_dot_picture(_dot_graph(what, source), path, fmt, f"the {what} picture")
    write_atomic(path, render(what, fmt, source))
    return path


def run(args: argparse.Namespace) -> int:
    fmt = _format(args)
    if args.what == "metagraph" and not is_plan_file(args.spec):
        source: MetaGraph | Plan = load_graph(args)
    else:
        source = load_plan(args)[0]
    if args.output is None:
        if fmt in ("png", "pdf"):
            raise SpindleError(f"{fmt} is binary: give -o FILE to write it")
        if fmt in ("svg", "dot") and args.what != "timeline":
            out = _dot_graph(args.what, source)
            from spindle_dsl.render.graphviz_tools import render_dot

            sys.stdout.write(out.source if fmt == "dot" else render_dot(out, fmt).decode())
            return 0
        data = render(args.what, fmt, source)
        sys.stdout.write(data if isinstance(data, str) else data.decode())
        return 0
    written = write_picture(args.what, fmt, source, Path(args.output))
    print(f"wrote {written}")
    return 0


# --- `spindle plan --svg FILE --trace FILE` -------------------------------------------------


def add_plan_outputs(parser: argparse.ArgumentParser) -> None:
    """The picture options of ``spindle plan``."""
    parser.add_argument(
        "--svg", metavar="FILE", help="also draw the wave plan (needs Graphviz dot)"
    )
    parser.add_argument(
        "--trace", metavar="FILE", help="also write a Chrome trace (open in ui.perfetto.dev)"
    )


def write_plan_outputs(args: argparse.Namespace, plan: Plan) -> int:
    """Write what ``--svg``/``--trace`` asked for; 1 if the picture could not be drawn (its DOT
    source is written instead and the reason printed), else 0."""
    from spindle_dsl.render.graphviz_tools import DotMissingError
    from spindle_dsl.render.trace import plan_trace, write_trace

    code = 0
    if getattr(args, "trace", None):
        write_trace(args.trace, plan_trace(plan))
        print(f"wrote {args.trace}", file=sys.stderr)
    if getattr(args, "svg", None):
        try:
            print(f"wrote {write_picture('waves', 'svg', plan, Path(args.svg))}", file=sys.stderr)
        except DotMissingError as exc:
            print(exc.render(), file=sys.stderr)
            code = 1
    return code
