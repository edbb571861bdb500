"""Measured training step time of the default plan vs the sequential plan on the same local
worker processes (gloo, CPU), and measured vs predicted step time.

Profiles the spec on this machine first (``spindle profile --nproc N``: layers, collectives,
optimizer, losses and stage costs on N worker processes, as the workers run) unless
``--profile`` names a profile, plans with the default scheduler and with the sequential baseline
under both the profile-fitted and the analytic cost model, trains every distinct plan for
``--steps`` steps on the same ``--nproc`` worker processes (each plan a fresh model, one step of
each in turn, so a busy machine slows all of them alike), and prints
the median step time of each beside its prediction. ``--exactness`` also trains the default
plan in float32 and in float64 and prints how far its losses and parameters are from the
single-process oracle. ``--optimizer-sharding`` also steps the default plan with the sharded
optimizer (reduce-scatter, and the all-reduce fallback) and unsharded, side by side on the same
processes, and prints each one's step time and optimizer-state bytes per rank. ``--levers``
also steps the default plan with 2 micro-batches and with ZeRO-2, alone and together, side by
side, and prints each one's step time and measured peak memory per rank. Every table shows the
measured peak memory of the largest rank beside the plan's prediction. ``--plans A.json B.json``
steps those plan files instead (e.g. one planner commit's plan against another's), in turn on
the same processes, and prints each one's predicted and measured step time.

    .venv/bin/python bench/train_cpu.py [SPEC] [--nproc 4] [--steps 30] [--exactness]
                                        [--optimizer-sharding] [--levers] [--plans F ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = REPO / "examples" / "tiny_mm.spindle"


def _plans(graph, profile: str | None):
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.planner import make_plan

    plans = {}
    for cost_name, source in (("profile", profile), ("analytic", None)):
        if cost_name == "profile" and source is None:
            continue
        cost = make_cost_model(graph.cluster, profile=source)
        for scheduler in ("default", "sequential"):
            plans[(scheduler, cost_name)] = make_plan(graph, cost, scheduler=scheduler)
    return plans


def _shape(plan) -> tuple:
    """What the runtime executes (times aside): two plans with one shape run identically."""
    return tuple(
        tuple((e.metaop, e.first, e.end, e.devices) for e in w.entries) for w in plan.waves
    )


def _exactness(graph, plan, nproc: int, steps: int) -> None:
    import torch

    from spindle_dsl.backends.base import RunConfig
    from spindle_dsl.backends.torch import ReferenceModel, TorchBackend
    from spindle_dsl.backends.torch import checkpoint as ck
    from spindle_dsl.backends.torch.parts import Part

    print(f"\nexactness: default plan on {nproc} processes vs one process, {steps} steps")
    print(f"{'dtype':<9}{'max loss rel err':>18}{'max param rel err':>19}  worst tensor")
    for dtype in ("float32", "float64"):
        ref = ReferenceModel(graph, dtype=dtype)
        history = ref.train(steps)
        with tempfile.TemporaryDirectory() as ckdir:
            config = RunConfig(steps=steps, dtype=dtype, checkpoint_dir=ckdir, progress=False)
            result = TorchBackend().train(graph, plan, config, nproc=nproc)
            loss_err = max(
                abs(v - want[t]) / abs(want[t])
                for want, rec in zip(history, result.steps, strict=True)
                for t, v in rec.losses
            )
            info = ck.latest(ckdir)
            worst, where = 0.0, ""
            for key, params in ref.state().items():
                saved = torch.load(ck.part_file(info.path, Part.from_key(key)), weights_only=True)
                for name, want in params.items():
                    err = float((saved["params"][name] - want).norm() / want.norm())
                    if err > worst:
                        worst, where = err, f"{key}:{name}"
        print(f"{dtype:<9}{loss_err:>18.2e}{worst:>19.2e}  {where}")


SHARDING_VARIANTS = (
    ("sharded, reduce-scatter", {"grad_collective": "reduce_scatter"}),
    ("sharded, all-reduce", {"grad_collective": "all_reduce"}),
    ("unsharded", {"optimizer_sharding": False}),
)


def _side_by_side(graph, plan, nproc: int, steps: int, variants, **base):
    """The plan once per variant (RunConfig changes) on the same processes, fresh models
    stepped in turn; returns the result and each variant's step records."""
    from spindle_dsl.backends.base import RunConfig
    from spindle_dsl.backends.torch import TorchBackend

    (_, first), *rest = variants
    config = RunConfig(steps=steps, progress=False, **{**base, **first})
    result = TorchBackend().train(
        graph, plan, config, nproc=nproc, compare=tuple((plan, c) for _, c in rest)
    )
    return result, [result.steps, *result.extra["compared"]]


def _sharding(graph, plan, nproc: int, steps: int) -> None:
    """The default plan three times on the same processes, once per optimizer variant: step
    time and what each rank holds of the optimizer state."""
    result, runs = _side_by_side(graph, plan, nproc, steps, SHARDING_VARIANTS)
    held = [result.extra["optimizer_state"], *result.extra["compared_optimizer_state"]]
    print(
        f"\noptimizer sharding: default plan on {nproc} processes, float32, the three variants "
        f"stepped in turn, median of steps 2..{steps}"
    )
    print(f"{'optimizer':<26}{'step s':>9}{'state MiB/rank (min-max)':>27}{'all ranks':>11}")
    for (name, _), run, per_rank in zip(SHARDING_VARIANTS, runs, held, strict=True):
        mib = [4 * sum(r.values()) / 2**20 for r in per_rank]  # float32 state
        m = statistics.median(r.seconds for r in run[1:])
        print(f"{name:<26}{m:>9.4f}{min(mib):>15.2f} - {max(mib):<9.2f}{sum(mib):>11.2f}")


LEVER_VARIANTS = (
    ("k=1, ZeRO-1", {}),
    ("k=2, ZeRO-1", {"micro_batches": 2}),
    ("k=1, ZeRO-2", {"zero_stage": 2}),
    ("k=2, ZeRO-2", {"micro_batches": 2, "zero_stage": 2}),
)


def _levers(graph, plan, nproc: int, steps: int) -> None:
    """The default plan with the memory levers the runtime carries out, stepped in turn on the
    same processes: step time and measured peak memory per rank."""
    result, runs = _side_by_side(
        graph, plan, nproc, steps, LEVER_VARIANTS, micro_batches=1, zero_stage=1
    )
    peaks = [result.extra["measured_peak_bytes"], *result.extra["compared_peak_bytes"]]
    print(
        f"\nmemory levers: default plan on {nproc} processes, float32, stepped in turn, median of "
        f"steps 2..{steps}; measured peak tensor MiB per rank"
    )
    print(f"{'variant':<14}{'step s':>9}  peak MiB per rank")
    for (name, _), run, peak in zip(LEVER_VARIANTS, runs, peaks, strict=True):
        m = statistics.median(r.seconds for r in run[1:])
        print(f"{name:<14}{m:>9.4f}  " + " ".join(f"{b / 2**20:.1f}" for b in peak))


def _in_turn(graph, plans: list, nproc: int, steps: int):
    """One job: the same worker processes hold every plan (each a fresh model) and step them
    in turn, so machine load falls on all plans alike; the result and each plan's steps."""
    from spindle_dsl.backends.base import RunConfig
    from spindle_dsl.backends.torch import TorchBackend

    first, *rest = plans
    config = RunConfig(steps=steps, progress=False)
    result = TorchBackend().train(graph, first, config, nproc=nproc, compare=tuple(rest))
    return result, [result.steps, *result.extra["compared"]]


def _plan_files(graph, files: list[str], nproc: int, steps: int) -> None:
    """Step each plan file in turn on the same processes: predicted and measured step time."""
    from spindle_dsl.plan.bundle import read_plan_file

    plans = [read_plan_file(f) for f in files]
    _, runs = _in_turn(graph, plans, nproc, steps)
    print(
        f"\n{nproc} gloo worker processes on {os.cpu_count()} CPU cores, the plans stepped in "
        f"turn on the same processes, median step time of steps 2..{steps}"
    )
    print(f"{'plan':<40}{'waves':>6}{'predicted s':>13}{'measured s':>12}{'measured/pred':>15}")
    for name, plan, run in zip(files, plans, runs, strict=True):
        m = statistics.median(r.seconds for r in run[1:])
        print(
            f"{name:<40}{len(plan.waves):>6}{plan.iteration_s:>13.4f}{m:>12.4f}"
            f"{m / plan.iteration_s:>15.2f}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="?", default=str(DEFAULT_SPEC))
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--profile", help="a profile from `spindle profile` (default: make one)")
    ap.add_argument("--no-profile", action="store_true", help="analytic cost model only")
    ap.add_argument("--exactness", action="store_true", help="also compare with the oracle")
    ap.add_argument(
        "--optimizer-sharding",
        action="store_true",
        help="also time the default plan with the optimizer sharded and unsharded",
    )
    ap.add_argument(
        "--levers",
        action="store_true",
        help="also time the default plan with 2 micro-batches and with ZeRO-2",
    )
    ap.add_argument("--plans", nargs="+", metavar="PLAN.json", help="step these plan files instead")
    args = ap.parse_args()

    from spindle_dsl.cli import main as spindle
    from spindle_dsl.errors import SpindleError
    from spindle_dsl.language import compile_file

    try:
        graph = compile_file(args.spec, cluster_overrides={"devices": args.nproc}).graph
        if args.plans:
            _plan_files(graph, args.plans, args.nproc, args.steps)
            return 0
        profile = args.profile
        workdir = tempfile.mkdtemp(prefix="train-bench-")
        if profile is None and not args.no_profile:
            profile = os.path.join(workdir, "profile.json")
            t0 = time.perf_counter()
            code = spindle(["profile", args.spec, "--devices", str(args.nproc),
                            "--nproc", str(args.nproc), "--out", profile, "-q"])  # fmt: skip
            if code:
                return code
            print(f"profiled {args.spec} in {time.perf_counter() - t0:.1f} s -> {profile}")
        plans = _plans(graph, profile)
        shapes: dict[tuple, list[tuple[str, str]]] = {}
        for key, plan in plans.items():
            shapes.setdefault(_shape(plan), []).append(key)
        order = list(shapes)
        distinct = [plans[shapes[shape][0]] for shape in order]
        result, runs = _in_turn(graph, distinct, args.nproc, args.steps)
        times = {
            shape: [r.seconds for r in run[1:]] for shape, run in zip(order, runs, strict=True)
        }
        peaks = [result.extra["measured_peak_bytes"], *result.extra["compared_peak_bytes"]]
        peak_of = {shape: max(p) for shape, p in zip(order, peaks, strict=True)}
    except SpindleError as exc:
        print(exc.render(), file=sys.stderr)
        return 1

    cores = os.cpu_count()
    print(
        f"\n{Path(args.spec).name}: {args.nproc} gloo worker processes on {cores} CPU cores, "
        f"1 thread each, float32; every plan stepped in turn on the same processes, "
        f"median step time of steps 2..{args.steps}"
    )
    print(
        f"{'plan':<12}{'cost model':<12}{'waves':>6}{'predicted s':>13}{'measured s':>12}"
        f"{'measured/pred':>15}{'peak MiB pred':>15}{'measured':>10}"
    )
    measured, peak = {}, {}
    for shape, keys in shapes.items():
        m = statistics.median(times[shape])
        for key in keys:
            measured[key], peak[key] = m, peak_of[shape]
    for (scheduler, cost), plan in plans.items():
        m = measured[(scheduler, cost)]
        predicted_peak = max(plan.memory_bytes) / 2**20 if plan.memory_bytes else float("nan")
        measured_peak = peak[(scheduler, cost)] / 2**20
        print(
            f"{scheduler:<12}{cost:<12}{len(plan.waves):>6}{plan.iteration_s:>13.4f}{m:>12.4f}"
            f"{m / plan.iteration_s:>15.2f}{predicted_peak:>15.1f}{measured_peak:>10.1f}"
        )
    for cost in ("profile", "analytic"):
        if ("default", cost) not in plans:
            continue
        d, s = plans[("default", cost)], plans[("sequential", cost)]
        md, ms = measured[("default", cost)], measured[("sequential", cost)]
        print(
            f"default vs sequential ({cost} plans): measured speed-up {ms / md:.2f}x, "
            f"predicted {s.iteration_s / d.iteration_s:.2f}x "
            f"(default = {d.solver.name})"
        )
    if args.exactness:
        key = ("default", "profile") if ("default", "profile") in plans else ("default", "analytic")
        _exactness(graph, plans[key], args.nproc, 5)
    key = ("default", "profile") if ("default", "profile") in plans else ("default", "analytic")
    if args.optimizer_sharding:
        _sharding(graph, plans[key], args.nproc, args.steps)
    if args.levers:
        _levers(graph, plans[key], args.nproc, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
