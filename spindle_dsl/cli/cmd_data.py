"""``spindle data``: training data on disk (the format is in ``backends/torch/datafiles.py``).

``spindle data synth SPEC --samples N --out DIR`` writes the first N samples of every task's
synthetic source as DIR/TASK/MODALITY.npy: a template to fill with real data, and data that
trains exactly as the in-memory synthetic source does. ``bind_data`` turns the ``--data``
flags of ``spindle train`` into the per-task sources the backend takes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from spindle_dsl.cli.common import add_spec_arguments, load_graph
from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph

_TASK_FORM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.+)")
DATA_HELP = (
    "training data: DIR (a folder with one sub-folder per task, named after it) or "
    "TASK=PATH (a folder of .npy arrays, or package.module:function); repeatable; overrides "
    'the spec\'s data = "..." (see `spindle data synth` for the format)'
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    synth = sub.add_parser(
        "synth",
        help="write the synthetic source of every task as .npy arrays",
        description="Write the first N samples of every task's synthetic source as "
        "OUT/TASK/MODALITY.npy (and target.npy for mse tasks).",
    )
    add_spec_arguments(synth)
    synth.add_argument("--samples", type=int, required=True, metavar="N", help="samples per task")
    synth.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    synth.add_argument("--seed", type=int, default=0, help="the run seed (default: 0)")
    synth.add_argument(
        "--variable-length",
        action="store_true",
        help="give every row of token ids or features a length (MODALITY.len.npy, between half "
        "its tokens and all of them, zeros after it): padded rows, to train and test masks",
    )


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.backends.torch.data import synthesize

    if args.samples < 1:
        raise ExecutionError(f"--samples must be at least 1, got {args.samples}")
    graph = load_graph(args)
    folders = synthesize(graph, args.out, args.samples, args.seed, args.variable_length)
    for task, folder in folders.items():
        names = ", ".join(sorted(p.name for p in folder.glob("*.npy")))
        print(f"{task}: {args.samples} samples in {folder} ({names})")
    return 0


def bind_data(flags: list[str] | None, graph: MetaGraph, flag: str = "--data") -> dict[str, str]:
    """``--data`` flags as task -> folder or ``package.module:function``, later flags winning.

    ``DIR`` binds every sub-folder named after a task being trained (the others draw a warning:
    a typo would otherwise leave a task on its synthetic data unnoticed); ``TASK=PATH`` binds
    one. Relative paths are taken from the working directory. ``flag``: the flag's name in
    messages (``--eval-data`` binds held-out data the same way)."""
    from spindle_dsl.language.files import is_reference

    tasks = [t.name for t in graph.tasks]
    out: dict[str, str] = {}
    for given in flags or ():
        m = _TASK_FORM.fullmatch(given)
        if m and not os.path.isdir(given):
            task, target = m.groups()
            if task not in tasks:
                raise ExecutionError(
                    f"{flag} {given}: the spec has no task {task} (its tasks: {', '.join(tasks)})"
                )
            out[task] = target if is_reference(target) else os.path.abspath(target)
            continue
        folder = Path(given)
        if not folder.is_dir():
            raise ExecutionError(
                f"{flag} {given}: not a folder "
                "(give DIR with one sub-folder per task, or TASK=PATH)"
            )
        entries = sorted(p.name for p in folder.iterdir() if p.is_dir())
        stray = [e for e in entries if e not in tasks and not e.startswith(".")]
        if stray:
            print(
                f"warning: {flag} {given}: sub-folder(s) {', '.join(stray)} match no task being "
                f"trained ({', '.join(tasks)}); ignored",
                file=sys.stderr,
            )
        matched = [e for e in entries if e in tasks]
        if not matched:
            raise ExecutionError(
                f"{flag} {given}: no sub-folder named after a task (its tasks: {', '.join(tasks)})"
            )
        out.update({task: os.path.abspath(folder / task) for task in matched})
    return out


def describe_data(
    graph: MetaGraph,
    datasets: dict[str, str],
    seed: int,
    eval_datasets: dict[str, str] | None = None,
) -> None:
    """Say where each task's samples come from (checking every source on the way), unless
    every task trains on its synthetic source, and where its held-out samples come from."""
    from spindle_dsl.backends.torch.data import TaskData

    sources = TaskData(graph, seed, datasets).describe()
    if any(v != "synthetic" for v in sources.values()):
        print("data: " + "; ".join(f"{t} <- {v}" for t, v in sources.items()), file=sys.stderr)
    if eval_datasets:
        held = TaskData(graph, seed, eval_datasets).describe()
        shown = "; ".join(f"{t} <- {held[t]}" for t in eval_datasets)
        print(f"eval data: {shown}", file=sys.stderr)
