"""``spindle profile SPEC --device cpu|cuda --out profile.json``: measure, fit, write.

Times one layer's forward+backward of every MetaOp shape with the real PyTorch layers at
several per-device batch sizes, fits the piecewise alpha-beta model, and writes the profile;
``--profile profile.json`` on later commands then uses the fitted curves. ``--device`` here is
where to measure (not a cluster preset): the cluster still comes from the spec, and
``--devices`` sets how many devices the batch sizes are planned for.
"""

from __future__ import annotations

import argparse
import sys
import time

from spindle_dsl.errors import SpindleError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="a .spindle file")
    parser.add_argument("--mix", help="the data mix to use (default: the first in the file)")
    parser.add_argument("--devices", type=int, help="cluster size to plan batch sizes for")
    parser.add_argument("--devices-per-node", type=int, help="devices in one node")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where to measure (default cpu)"
    )
    parser.add_argument("--out", "-o", default="profile.json", help="profile file to write")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads while timing (default 1, like one worker process per core)",
    )
    parser.add_argument(
        "--points", type=int, default=5, help="batch sizes to time per MetaOp shape (default 5)"
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.cost.profiler import profile_graph
    from spindle_dsl.language import compile_file

    if args.points < 2:
        raise SpindleError("--points must be at least 2 (a line needs two points)")
    if args.threads is not None and args.threads < 1:
        raise SpindleError("--threads must be at least 1")
    overrides = {
        k: v
        for k, v in (("devices", args.devices), ("devices_per_node", args.devices_per_node))
        if v is not None
    }
    compiled = compile_file(args.spec, mix=args.mix, cluster_overrides=overrides)
    if compiled.warnings:
        print(compiled.render_warnings(), file=sys.stderr)
    graph = compiled.graph

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    start = time.perf_counter()
    profile = profile_graph(
        graph, device=args.device, threads=args.threads, points=args.points, progress=progress
    )
    profile.write(args.out)
    timings = sum(len(e.samples) for e in profile.entries)
    print(
        f"wrote {args.out}: {len(profile.entries)} layer shapes, {timings} timings on "
        f"{profile.device_name} in {time.perf_counter() - start:.1f} s"
    )
    return 0
