"""``spindle plot LOG.jsonl -o loss.png``: a run's training curves from its step log.

Reads what ``spindle train --log-json`` wrote and draws each task's training and held-out loss
and the learning rate against the step (``spindle_dsl/render/training.py``); the format
follows the output's suffix (png, svg or pdf).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spindle_dsl.atomic import write_atomic
from spindle_dsl.errors import SpindleError

FORMATS = ("png", "svg", "pdf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", metavar="LOG.jsonl", help="a step log of spindle train --log-json")
    parser.add_argument(
        "-o", "--out", required=True, metavar="FILE", help="the picture: .png, .svg or .pdf"
    )
    parser.add_argument("--title", help="the picture's title (default: the log's file name)")


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.render.training import read_log, training_plot_bytes

    fmt = Path(args.out).suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise SpindleError(f"-o {args.out}: the picture is .png, .svg or .pdf")
    curves = read_log(args.log)
    write_atomic(args.out, training_plot_bytes(curves, fmt, args.title or Path(args.log).name))
    evaluated = sum(len(v) for v in curves.eval_loss.values())
    print(
        f"{args.out}: {len(curves.steps)} steps, {len(curves.loss)} task(s), "
        f"{evaluated} held-out point(s)"
    )
    return 0
