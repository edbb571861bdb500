"""Which cost model ``spindle plan`` and ``spindle train`` price a CPU cluster with.

The analytic model's CPU figures are a datasheet-style guess (a core's FLOP/s, gloo's
bandwidth), typically 1.5-3x off a real machine; a profile of the machine
(``spindle profile --nproc N``) prices it. So on a CPU cluster, without ``--profile``, the two
commands use the profile cache of this machine (``cost.profile_cache``): what it holds for the
spec is used as it is; what it lacks is measured first, on as many local worker processes as
the run has ranks, with a progress bar, and filed into the cache for the next run. Where the
cache is refused (``--no-cache``, or ``SPINDLE_NO_CACHE`` set to anything but 0) or cannot be
made (more devices than this machine can spawn, several nodes, a run under torchrun whose
cache lacks terms, a measurement that fails), the analytic model prices the plan and the
commands say plainly that its prediction is uncalibrated (``uncalibrated_text``). GPU
clusters keep the analytic presets, and ``--profile FILE`` wins over everything.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost.comm import is_cpu
from spindle_dsl.cost.machine import MachineKey
from spindle_dsl.cost.profile import Profile
from spindle_dsl.cost.profile_cache import CachedProfile, cache_path, read_cache, write_cache
from spindle_dsl.cost.profile_needs import ProfileNeeds, ProfileSelection
from spindle_dsl.errors import SpindleError
from spindle_dsl.metagraph import MetaGraph

NO_CACHE_ENV = "SPINDLE_NO_CACHE"
# the most worker processes a command spawns here to measure: a few per core (each imports
# torch, and more than that only time-slice), never fewer than this floor
RANKS_PER_CORE = 2
MIN_LOCAL_RANKS = 8


@dataclass(frozen=True)
class Calibration:
    """The outcome: the cached profile to price with (None: ``--profile``'s file, or the
    analytic model), and why a CPU cluster's prediction is uncalibrated (None where it is
    not: a profile prices it, or the cluster is GPUs)."""

    profile: Profile | None = None
    uncalibrated: str | None = None
    cache_off: bool = False  # the cache was refused (``--no-cache``, ``SPINDLE_NO_CACHE``)


def add_cache_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="on a cpu cluster, neither read nor write the profile cache of this machine: "
        "price with the analytic model, an uncalibrated first guess (also: SPINDLE_NO_CACHE=1)",
    )


def cache_refused(args: argparse.Namespace) -> str | None:
    """Why the cache is not to be used (the flag or the environment), or None."""
    if getattr(args, "no_cache", False):
        return "--no-cache"
    if os.environ.get(NO_CACHE_ENV, "").strip() not in ("", "0"):
        return f"{NO_CACHE_ENV} is set"
    return None


def local_ranks(cluster: Cluster) -> tuple[int | None, str | None]:
    """The worker processes that measure ``cluster``'s devices here (one per device), or None
    and why they cannot be spawned here."""
    if cluster.devices_per_node < cluster.devices:
        return None, (
            f"the cluster spans {-(-cluster.devices // cluster.devices_per_node)} nodes, whose "
            "links one machine cannot measure"
        )
    most = max(MIN_LOCAL_RANKS, RANKS_PER_CORE * (os.cpu_count() or 1))
    if cluster.devices > most:
        return None, (
            f"{cluster.devices} devices are more worker processes than this machine spawns "
            f"to measure (at most {most})"
        )
    return cluster.devices, None


def calibrate(
    args: argparse.Namespace,
    graphs: Sequence[MetaGraph],
    ranks: int | None,
    *,
    may_measure: bool = True,
    why_not: str | None = None,
) -> Calibration:
    """The cost model's profile for ``graphs`` (a spec's, or its schedule's phases') on
    ``ranks`` worker processes (None: they cannot be measured here, ``why_not`` says why);
    ``may_measure`` False only reads the cache (a run under torchrun). Sets ``args.profile``
    to the cached profile, so that ``load_cost_model`` and the phase planner use it."""
    if getattr(args, "profile", None) or not is_cpu(graphs[0].cluster):
        return Calibration()
    refused = cache_refused(args)
    if refused:
        return Calibration(uncalibrated=f"the profile cache is off: {refused}", cache_off=True)
    if ranks is None:
        return Calibration(uncalibrated=why_not or "the workers cannot be measured here")
    try:
        got = from_cache(graphs, ranks, may_measure)
    except Exception as exc:  # any failure to measure falls back, never a traceback
        what = str(exc) if isinstance(exc, SpindleError) else f"{type(exc).__name__}: {exc}"
        got = Calibration(uncalibrated=f"measuring this machine failed: {what}")
    if got.profile is not None:
        args.profile = got.profile
    return got


def from_cache(graphs: Sequence[MetaGraph], ranks: int, may_measure: bool) -> Calibration:
    """The cache's profile for ``graphs``, after measuring what it lacks (where allowed)."""
    key = MachineKey.here(ranks)
    path = cache_path(key)
    cached, warning = read_cache(path, key)
    if warning:
        say(f"warning: {warning}")
    needs = reduce(ProfileNeeds.merged, (ProfileNeeds.of(g) for g in graphs))
    lacking = cached.missing(needs)
    if not lacking.empty:
        if not may_measure:
            return Calibration(
                uncalibrated=f"the profile cache {path} lacks {lacking.describe()} of this "
                "spec, and a run under torchrun does not measure (run `spindle plan SPEC` "
                "on one of its machines first)"
            )
        cached = measure_missing(cached, graphs, ranks, path)
        still = cached.missing(needs)
        if not still.empty:
            return Calibration(uncalibrated=f"the measurement left out {still.describe()}")
    say(f"cost model: the cached profile of this machine, {path}")
    return Calibration(profile=cached.for_needs(needs, str(path)))


def measure_missing(
    cached: CachedProfile, graphs: Sequence[MetaGraph], ranks: int, path: Path
) -> CachedProfile:
    """Measure what each graph lacks on ``ranks`` workers and file it into the cache; write
    the results into the cache file as it is by then (another run may have written it
    meanwhile; one that is gone or unreadable is replaced). A cache that cannot be written is
    warned about, and its figures are used all the same."""
    start = time.perf_counter()
    runs: list[tuple[Profile, ProfileNeeds, ProfileSelection]] = []
    for graph in graphs:
        needs = ProfileNeeds.of(graph)
        selection = cached.missing(needs)
        if selection.empty:
            continue
        say(
            f"profiling this machine for the cost model: {selection.describe()} on {ranks} "
            f"worker process{'es' if ranks > 1 else ''} (once: the results are cached)"
        )
        measured = measure_on_workers(graph, ranks, selection)
        runs.append((measured, needs, selection))
        cached = cached.merged(measured, needs, selection)
    fresh, _ = read_cache(path, cached.machine)
    if fresh.profile.overheads is None:
        fresh = cached
    else:
        for measured, needs, selection in runs:
            fresh = fresh.merged(measured, needs, selection)
    try:
        write_cache(path, fresh)
    except OSError as exc:
        say(f"warning: cannot write the profile cache {path}: {exc.strerror or exc}")
    say(f"measured in {time.perf_counter() - start:.1f} s, cached in {path}")
    return cached


def measure_on_workers(graph: MetaGraph, ranks: int, selection: ProfileSelection) -> Profile:
    """``spindle profile --nproc ranks``'s measurement of ``graph``, of ``selection`` only."""
    from spindle_dsl.backends.torch.profiling import ProfileSettings, profile_on_workers

    return profile_on_workers(graph, ranks, ProfileSettings(device="cpu", only=selection))


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def uncalibrated_text(calibration: Calibration, spec: str, ranks: int | None) -> str:
    """The plain statement that a CPU cluster's prediction is the analytic first guess, why,
    and how to calibrate it."""
    n = f" --nproc {ranks}" if ranks else ""
    cache = (
        f"run without --no-cache and {NO_CACHE_ENV} (the machine is then profiled once, into "
        "its profile cache), or "
        if calibration.cache_off
        else ""
    )
    return (
        "note: the predicted step time is uncalibrated: the analytic model's first guess for "
        f"CPU workers, often 1.5-3x off a real machine ({calibration.uncalibrated}). To "
        f"calibrate it, {cache}profile the machine the run will use: spindle profile {spec}{n} "
        "--out profile.json, then pass --profile profile.json"
    )


def calibrate_plan(args: argparse.Namespace, graphs: Sequence[MetaGraph]) -> Calibration:
    """``spindle plan``'s calibration: measured on one worker process per device of the
    cluster, where this machine can spawn them."""
    ranks, why = local_ranks(graphs[0].cluster)
    return calibrate(args, graphs, ranks, why_not=why)


def calibrate_train(args: argparse.Namespace, graphs: Sequence[MetaGraph]) -> Calibration:
    """``spindle train``'s calibration: on its ``--nproc`` workers, measured where the cache
    lacks terms; under torchrun (no ``--nproc``) read from the cache only, and only for a run
    on one machine."""
    if args.nproc is not None:
        return calibrate(args, graphs, args.nproc)
    ranks, why = local_ranks(graphs[0].cluster)
    return calibrate(args, graphs, ranks, may_measure=False, why_not=why)
