"""``spindle export``: the model's weights as one safetensors file.

With ``--checkpoint-dir`` the newest checkpoint's weights, as trained; without, the initial
weights (``from`` files, else the seeded initialisation). Keys are ``MODULE.ROLE.PARAM``, what a
module declared ``from "FILE"`` reads back.
"""

from __future__ import annotations

import argparse

from spindle_dsl.cli.common import add_spec_arguments, load_graph


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser)
    parser.add_argument("-o", "--out", required=True, metavar="FILE", help="the file to write")
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
    done = export_model(
        graph, args.out, checkpoint_dir=args.checkpoint_dir, seed=args.seed, dtype=args.dtype
    )
    print(f"wrote {done.path}: {done.tensors} tensors, {done.params:,} parameters ({done.source})")
    return 0
