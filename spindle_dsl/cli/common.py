"""Arguments and loading steps that several subcommands share.

Every command that starts from a spec takes the same options (mix, cluster overrides, a
profile) and goes through the same pipeline: compile the spec to a MetaGraph, then pick the
cost model. Keeping that here means the commands agree on flags and on what they mean.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from spindle_dsl.cluster import GB_PER_S, GiB
from spindle_dsl.metagraph import MetaGraph


def add_spec_arguments(parser: argparse.ArgumentParser, *, spec_required: bool = True) -> None:
    """SPEC plus the flags that override what the spec file says."""
    parser.add_argument(
        "spec", metavar="SPEC", nargs=None if spec_required else "?", help="a .spindle file"
    )
    parser.add_argument("--mix", help="the data mix to use (default: the first in the file)")
    group = parser.add_argument_group("cluster overrides (take precedence over the spec)")
    group.add_argument("--devices", type=int, help="number of devices")
    group.add_argument("--devices-per-node", type=int, help="devices in one node")
    group.add_argument("--device", help="device preset, e.g. A100-80GB, H100-80GB, cpu")
    group.add_argument("--tflops", type=float, help="peak TFLOP/s per device")
    group.add_argument("--memory-gb", type=float, help="memory per device in GiB")
    group.add_argument("--intra-bandwidth", type=float, help="GB/s per device inside a node")
    group.add_argument("--inter-bandwidth", type=float, help="GB/s per device across nodes")
    group.add_argument(
        "--cores",
        type=int,
        help="CPU cores the cpu devices of a node share (default: this machine's usable cores)",
    )
    parser.add_argument(
        "--profile",
        metavar="PROFILE.json",
        help="use time curves fitted by `spindle profile` instead of the analytic model",
    )


def cluster_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The overrides given on the command line, as keywords of ``Cluster.with_overrides``."""
    out: dict[str, Any] = {}
    if args.devices is not None:
        out["devices"] = args.devices
    if args.devices_per_node is not None:
        out["devices_per_node"] = args.devices_per_node
    if args.device is not None:
        out["device"] = args.device
    if args.tflops is not None:
        out["peak_flops"] = args.tflops * 1e12
    if args.memory_gb is not None:  # not finite: left for the checker to refuse
        gib = args.memory_gb * GiB
        out["memory_bytes"] = int(gib) if math.isfinite(gib) else gib
    if args.intra_bandwidth is not None:
        out["intra_bandwidth"] = args.intra_bandwidth * GB_PER_S
    if args.inter_bandwidth is not None:
        out["inter_bandwidth"] = args.inter_bandwidth * GB_PER_S
    if getattr(args, "cores", None) is not None:
        out["cores"] = args.cores
    return out


def load_graph(args: argparse.Namespace, *, show_warnings: bool = True) -> MetaGraph:
    """Compile SPEC with the command line's mix and overrides; warnings go to stderr."""
    return load_compiled(args, show_warnings=show_warnings).graph


def load_compiled(
    args: argparse.Namespace,
    *,
    show_warnings: bool = True,
    train_overrides: dict[str, Any] | None = None,
):  # -> Compiled
    """``load_graph``'s compile, whole: with the phases of the spec's schedule, if it has one
    (and no ``--mix`` set it aside); ``train_overrides`` replace the train block's settings."""
    from spindle_dsl.language import compile_file

    compiled = compile_file(
        args.spec,
        mix=args.mix,
        cluster_overrides=cluster_overrides(args),
        train_overrides=train_overrides,
    )
    if show_warnings and compiled.warnings:
        print(compiled.render_warnings(), file=sys.stderr)
    return compiled


def load_cost_model(args: argparse.Namespace, graph: MetaGraph):  # -> CostModel
    """The analytic model, or the one fitted to ``--profile``, with ``--tp``'s degree."""
    from spindle_dsl.cost import make_cost_model

    profile = getattr(args, "profile", None)
    return make_cost_model(graph.cluster, profile=profile, tp=getattr(args, "tp", None))


def add_tp_argument(parser: argparse.ArgumentParser) -> None:
    """``--tp K``: the tensor-parallel degree of every entry that can run it."""

    def degree(text: str) -> int:
        value = int(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"a tensor-parallel degree is at least 1, got {value}")
        return value

    parser.add_argument(
        "--tp",
        type=degree,
        default=None,
        metavar="K",
        help="run every entry on K or more devices K-way tensor parallel where its kind splits "
        "K-way (transformer, vit and mlp layers whose heads and widths K divides), data "
        "parallel on fewer; 1: data parallel only; default: the cost model chooses",
    )
