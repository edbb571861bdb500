"""``spindle profile SPEC [--nproc N] --device cpu|cuda --out profile.json``: measure, fit, write.

Times one layer's forward+backward of every MetaOp shape with the real PyTorch layers at
several per-device batch sizes, fits the piecewise alpha-beta model, and writes the profile;
``--profile profile.json`` on later commands then uses the fitted curves. ``--device`` here is
where to measure (not a cluster preset): the cluster still comes from the spec, and
``--devices`` sets how many devices the batch sizes are planned for.

With ``--nproc N`` it measures on N worker processes of the backend a run uses (spawned as
``spindle train --nproc N`` spawns them: gloo on CPU, NCCL on CUDA, the workers' own thread
setting), and measures everything else a step does too: the process group's collectives and
point-to-point exchange, the optimizer, the input stages, the loss heads and the fixed cost
per stage (``spindle_dsl.backends.torch.profiling``); every shape the runtime can split is
also timed tensor parallel, as a group of 2, 3, ... ranks runs it (up to N, and no more ranks
than cores), so that a plan prices those layouts as measured. Without it, one process times
the layers alone (data parallel) and the rest of the step keeps its analytic figures.
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
        help="torch CPU threads while timing in this process (default 1, like one worker "
        "process per core; with --nproc the workers keep their own setting, as in a run)",
    )
    parser.add_argument(
        "--points", type=int, default=5, help="batch sizes to time per MetaOp shape (default 5)"
    )
    parser.add_argument(
        "--nproc",
        type=int,
        help="measure on this many worker processes of the run's backend (collectives, "
        "exchange, optimizer, inputs, losses too); use the number of ranks the run will have",
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
    if args.nproc is not None:
        profile = _on_workers(graph, args)
    else:
        profile = profile_graph(
            graph, device=args.device, threads=args.threads, points=args.points, progress=progress
        )
    profile.write(args.out)
    timings = sum(len(e.samples) for e in profile.entries)
    split = sum(1 for e in profile.entries if e.tp > 1)
    where = (
        f"{profile.nproc} {profile.backend} worker processes ({profile.device_name})"
        if profile.nproc
        else profile.device_name
    )
    print(
        f"wrote {args.out}: {len(profile.entries) - split} layer shapes"
        f"{f' (and {split} tensor-parallel layouts)' if split else ''}, {timings} timings"
        f"{', and the step overheads' if profile.overheads else ''} on {where} in "
        f"{time.perf_counter() - start:.1f} s"
    )
    return 0


def _on_workers(graph, args: argparse.Namespace):  # -> Profile
    from spindle_dsl.backends.torch.profiling import ProfileSettings, profile_on_workers
    from spindle_dsl.cost.profiler import check_device

    if args.nproc < 1:
        raise SpindleError(f"--nproc must be at least 1, got {args.nproc}")
    check_device(args.device)
    settings = ProfileSettings(device=args.device, points=args.points, progress=not args.quiet)
    return profile_on_workers(graph, args.nproc, settings)
