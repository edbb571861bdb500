"""``spindle export``: the model's weights as one safetensors file, or as Hugging Face folders.

With ``--checkpoint-dir`` the newest checkpoint's weights, as trained; without, the initial
weights (``from`` files, else the seeded initialisation). Keys are ``MODULE.ROLE.PARAM``, what a
module declared ``from "FILE"`` reads back. ``--format hf`` writes each module (or the one
``--module`` names) as a folder transformers' ``from_pretrained`` loads (``spindle_dsl/hf``);
a module no architecture holds keeps the project's format in its folder.
"""

from __future__ import annotations

import argparse
import sys

from spindle_dsl.cli.common import add_spec_arguments, load_graph


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser)
    parser.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="PATH",
        help="the file to write (--format hf: the folder, one sub-folder per module)",
    )
    parser.add_argument(
        "--format",
        choices=("safetensors", "hf"),
        default="safetensors",
        help="one safetensors file of MODULE.ROLE.PARAM keys (default), or Hugging Face folders",
    )
    parser.add_argument(
        "--module", metavar="NAME", help="--format hf: only this module, as the folder PATH"
    )
    parser.add_argument(
        "--checkpoint-dir", metavar="DIR", help="export the newest checkpoint under DIR"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="initialisation seed without a checkpoint (default: 0)"
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "float64", "bfloat16"),
        default="float32",
        help="dtype of initial weights without a checkpoint (a checkpoint keeps its own)",
    )


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.backends.torch.export import export_model

    graph = load_graph(args)
    if args.format == "hf":
        return _run_hf(args, graph)
    if args.module is not None:
        print("spindle export: --module goes with --format hf", file=sys.stderr)
        return 1
    done = export_model(
        graph, args.out, checkpoint_dir=args.checkpoint_dir, seed=args.seed, dtype=args.dtype
    )
    print(f"wrote {done.path}: {done.tensors} tensors, {done.params:,} parameters ({done.source})")
    return 0


def _run_hf(args: argparse.Namespace, graph) -> int:
    from spindle_dsl.backends.torch.export import model_tensors
    from spindle_dsl.hf.export import export_folders

    tensors, source = model_tensors(graph, args.checkpoint_dir, args.seed, args.dtype)
    for done in export_folders(graph, args.out, tensors, args.module):
        what = f"{done.model_type} folder" if done.model_type else "the project's format"
        line = f"wrote {done.folder} ({what}): {done.tensors} tensors, {done.params:,} parameters"
        print(f"{line} ({source})")
        if done.note:
            print(f"  note: {done.note}")
    return 0
