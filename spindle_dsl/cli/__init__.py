"""The ``spindle`` command: a thin shell over the library's stage functions.

Each subcommand lives in its own module (``spindle_dsl.cli.cmd_<name>``) with two functions,
``add_arguments(parser)`` and ``run(args) -> int``, and is imported only when invoked, so that
``spindle check`` never pays for importing torch or the MILP solver.

Exit codes: 0 success, 1 a spec, plan or run error (printed as diagnostics), 2 usage.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Sequence

from spindle_dsl import __version__
from spindle_dsl.errors import SpindleError

# name -> (one-line help, example)
COMMANDS: dict[str, tuple[str, str]] = {
    "check": (
        "parse and check a spec, print its MetaOps",
        "spindle check examples/tiny_mm.spindle",
    ),
    "fmt": ("rewrite a spec in the canonical layout", "spindle fmt --check examples/*.spindle"),
    "curves": ("print every MetaOp's time curve T_m(n)", "spindle curves SPEC --devices 16"),
    "profile": (
        "measure the real layers and fit time curves",
        "spindle profile examples/tiny_mm.spindle --out profile.json",
    ),
    "plan": (
        "make a wave plan and write it as JSON",
        "spindle plan examples/qwen_val.spindle --devices 32 --out plan.json",
    ),
    "validate": ("check a plan file's invariants", "spindle validate plan.json"),
    "render": (
        "draw a MetaGraph, a wave plan or a timeline",
        "spindle render plan.json --what waves -o waves.svg",
    ),
    "report": ("write a self-contained HTML report", "spindle report SPEC -o report.html"),
    "train": (
        "train for real on torch.distributed",
        "spindle train examples/tiny_mm.spindle --nproc 4 --steps 5",
    ),
    "data": (
        "write training data in the on-disk format (synthetic, as a template)",
        "spindle data synth examples/tiny_mm.spindle --samples 256 --out data",
    ),
    "export": (
        "write the model's weights as one safetensors file",
        "spindle export SPEC --checkpoint-dir ckpt -o model.safetensors",
    ),
    "compare": (
        "set a plan's prediction against a measured trace",
        "spindle compare plan.json train-trace.json",
    ),
    "plot": (
        "draw a run's loss and learning rate from its step log",
        "spindle plot train.jsonl -o loss.png",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    epilog = "examples:\n" + "\n".join(f"  {ex}" for _, ex in COMMANDS.values())
    parser = argparse.ArgumentParser(
        prog="spindle",
        description="Plan and run multi-task multi-modal training with wavefront scheduling.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"spindle-dsl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, _example) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _command_parser(name: str) -> argparse.ArgumentParser:
    help_text, example = COMMANDS[name]
    parser = argparse.ArgumentParser(
        prog=f"spindle {name}",
        description=help_text,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


MAX_START_UP_S = 5.0  # start-up beyond this is not ours to count (a clock off, a suspended VM)


def process_started(latest: float) -> float:
    """When this process started, on ``time.perf_counter``'s clock, where the system says
    (Linux's ``/proc``), else ``latest``: a command's time budget (``--time-limit``) counts
    the interpreter's start-up and imports too, as its wall time does."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return latest
    return latest - min(max(age - (time.perf_counter() - latest), 0.0), MAX_START_UP_S)


def main(argv: Sequence[str] | None = None) -> int:
    # a command's time budget counts from here (``--time-limit``): the process's start where
    # this is the process's command, else this call
    started = time.perf_counter()
    if argv is None:
        started = process_started(started)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = build_parser()
        if not argv:
            parser.print_help()
            return 2
        try:
            parser.parse_args(argv[:1])  # prints --help/--version or a usage error
        except SystemExit as exc:
            return int(exc.code or 0)
        return 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(f"spindle_dsl.cli.cmd_{name}")
    parser = _command_parser(name)
    module.add_arguments(parser)
    try:
        args = parser.parse_args(rest)
    except SystemExit as exc:
        return int(exc.code or 0)
    args.started = started
    try:
        return int(module.run(args) or 0)
    except SpindleError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of our output went away (`spindle check ... | head`): not an error of
        # the spec; stop quietly, with stdout pointed at nothing so the final flush is silent
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
