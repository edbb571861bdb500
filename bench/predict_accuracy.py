"""Predicted against measured step time, spec by spec and plan by plan, profiled in the same run.

For each case (a spec on N worker processes) it runs, back to back, what a user runs:

    spindle profile SPEC --devices N --nproc N --out P.json
    spindle train SPEC --devices N --nproc N --steps S --profile P.json --scheduler X \\
        --trace T.json --summary-json J.json        (X = default, then sequential)

and prints each plan's predicted step time (the plan's ``iteration_s``), the measured one (the
median of steps 2..S), their ratio, whether it is within the target (25%; 35% with more
processes than cores), predicted over measured peak memory per rank (the lowest and highest
ratio), and the step term that misses most (``spindle compare``); then, per case, the default
plan's measured step over the sequential plan's (the target: never more than 10% slower). The
machine's load average is printed when the case was profiled and after each run: on a shared
machine the figures move with it, and a profile made under another load than the run predicts
another machine.

A virtual machine's speed also drifts by itself (the same layer's time can move by tens of percent
within seconds, with nothing else running). So the bench times a fixed single-threaded matrix
product just before each profile and each run (``speed_probe``) and prints the run's probe over the
profile's (``drift``: 1.20 = the machine was 20% slower when the run started than when it was
profiled), and ``--repeat R`` runs every case R times, profile included, and adds a table of each
row's median ratio over the repeats with its spread: the figure to judge a target by on such a
machine. The two plans of a case take turns going first from one repeat to the next, so that a drift
within a cycle does not always favour one.

Whether the default plan beats the sequential one is a comparison of two runs, and such a drift
between them decides it on its own (two cycles of one run and pairs of the same two plans run in
alternation right after can disagree on which is quicker). ``--turns T`` runs each cycle's two
plans T times each, alternating (A B, then B A, ...), from one profile: every turn is a pair of
runs a few seconds apart, and the default/sequential figure of a case is the median of its
pairs' ratios.

    .venv/bin/python bench/predict_accuracy.py [--steps 8] [--repeat 3] [--turns 2]
        [--cases tiny_mm@2 ...] [--tp K]

``--tp K`` plans both with ``--tp K`` (the profile times the tensor-parallel layers as well).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPECS = {
    "tiny_mm": REPO / "examples" / "tiny_mm.spindle",
    "cpu_medium": REPO.parent / "shared" / "spec" / "cpu_medium.spindle",
    "frozen_towers": REPO / "bench" / "specs" / "frozen_towers.spindle",
    "wide_adapters": REPO / "bench" / "specs" / "wide_adapters.spindle",
    "long_text": REPO / "bench" / "specs" / "long_text.spindle",
}
DEFAULT_CASES = (
    "tiny_mm@2",
    "cpu_medium@2",
    "frozen_towers@2",
    "wide_adapters@2",
    "long_text@2",
    "tiny_mm@4",
)
SCHEDULERS = ("default", "sequential")


def spindle(*args: str) -> None:
    """Run one spindle command as a user would; stop the bench if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "spindle_dsl", *args], capture_output=True, text=True, check=False
    )
    if done.returncode:
        sys.exit(f"spindle {' '.join(args)} failed:\n{done.stderr}")


def worst_term(plan_file: Path, trace_file: Path) -> str:
    """The step term the prediction misses most, as ``spindle compare`` ranks them."""
    from spindle_dsl.plan.model import Plan
    from spindle_dsl.render.compare import compare
    from spindle_dsl.render.measured import load_trace, read_measured

    rows = compare(Plan.read(plan_file), read_measured(load_trace(trace_file)))
    term = next((r for r in rows if r.kind == "term"), None)
    if term is None:
        return "-"
    return f"{term.name} {term.predicted_s * 1e3:.1f}/{term.measured_s * 1e3:.1f} ms"


def speed_probe() -> float:
    """Seconds of a fixed single-threaded 192x192 matrix product (the median of 40): how fast
    the machine runs right now, to compare a run's moment with its profile's."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(192, 192)
        times = []
        for _ in range(40):
            t0 = time.perf_counter()
            for _ in range(8):
                a @ a
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(threads)


def run_case(
    name: str,
    nproc: int,
    steps: int,
    work: Path,
    cycle: int = 0,
    turns: int = 1,
    tp: int | None = None,
) -> list[dict]:
    """Profile the case once, plan it with both schedulers (``--tp tp`` where given), then
    train each plan ``turns`` times, the plans alternating; a row per run."""
    spec = str(SPECS[name])
    common = ("--devices", str(nproc), "--nproc", str(nproc))
    profile = work / f"{name}-{nproc}-{cycle}-profile.json"
    load_profile = os.getloadavg()[0]
    speed_profile = speed_probe()
    t0 = time.perf_counter()
    spindle("profile", spec, *common, "--out", str(profile), "-q")
    profiled_s = time.perf_counter() - t0
    plans = {}
    for scheduler in SCHEDULERS:
        plans[scheduler] = work / f"{name}-{nproc}-{cycle}-{scheduler}-plan.json"
        spindle("plan", spec, "--devices", str(nproc), "--profile", str(profile),
                "--scheduler", scheduler, "--out", str(plans[scheduler]), "--quiet",
                *(("--tp", str(tp)) if tp else ()))  # fmt: skip
    out = []
    for turn in range(max(1, turns)):
        # default first in even cycles and turns, sequential first otherwise: on a machine
        # whose speed drifts, a fixed order would favour whichever plan runs earlier
        order = SCHEDULERS if (cycle + turn) % 2 == 0 else tuple(reversed(SCHEDULERS))
        for scheduler in order:
            row = train_once(name, nproc, steps, plans[scheduler], turn, speed_profile)
            place = {"plan": scheduler, "cycle": cycle, "turn": turn}
            out.append(row | place | {"profile_s": profiled_s, "load_profile": load_profile})
    return out


def train_once(
    name: str, nproc: int, steps: int, plan: Path, turn: int, speed_profile: float
) -> dict:
    """One ``spindle train`` of ``plan`` (its ``turn``-th), as a row of the table without the
    plan's name and the case's profile."""
    stem = f"{str(plan).removesuffix('-plan.json')}-{turn}"
    trace, summary = Path(f"{stem}-trace.json"), Path(f"{stem}-summary.json")
    drift = speed_probe() / speed_profile
    spindle("train", str(SPECS[name]), "--devices", str(nproc), "--nproc", str(nproc),
            "--steps", str(steps), "--plan", str(plan), "--trace", str(trace),
            "--summary-json", str(summary), "--no-progress")  # fmt: skip
    s = json.loads(summary.read_text())
    return {
        "spec": name,
        "ranks": nproc,
        "drift": drift,
        "predicted_s": s["predicted_step_s"],
        "measured_s": s["measured_step_s"],
        "load_after": os.getloadavg()[0],
        "worst_term": worst_term(plan, trace),
        "peak_ratios": [  # predicted / measured peak tensor bytes, per rank
            p / m
            for p, m in zip(s["predicted_peak_bytes"], s["measured_peak_bytes"], strict=True)
            if p and m
        ],
    }


def _limit(ranks: int, cores: int) -> float:
    return 0.35 if ranks > cores else 0.25


def _verdict(ratio: float, ranks: int, cores: int) -> str:
    return "ok" if abs(ratio - 1) <= _limit(ranks, cores) else "MISS"


def _by_pair(rows: list[dict]) -> dict[tuple[str, int, int, int], dict[str, dict]]:
    """The rows of each pair of runs (a case's cycle and turn), by plan."""
    out: dict[tuple[str, int, int, int], dict[str, dict]] = {}
    for r in rows:
        out.setdefault((r["spec"], r["ranks"], r["cycle"], r["turn"]), {})[r["plan"]] = r
    return out


def print_rows(rows: list[dict], cores: int) -> None:
    print(
        f"{'spec':<15}{'ranks':>6}  {'plan':<11}{'run':>5}{'predicted s':>12}{'measured s':>12}"
        f"{'meas/pred':>10}  {'target':<7}{'drift':>6}{'peak p/m':>10}{'profile s':>10}"
        f"{'load':>10}  worst term (pred/meas)"
    )
    for r in rows:
        ratio = r["measured_s"] / r["predicted_s"]
        peaks = r["peak_ratios"]
        peak = f"{min(peaks):.2f}-{max(peaks):.2f}" if peaks else "-"
        print(
            f"{r['spec']:<15}{r['ranks']:>6}  {r['plan']:<11}{_run(r):>5}"
            f"{r['predicted_s']:>12.4f}{r['measured_s']:>12.4f}{ratio:>10.2f}"
            f"  {_verdict(ratio, r['ranks'], cores):<7}{r['drift']:>6.2f}{peak:>10}"
            f"{r['profile_s']:>10.1f}{r['load_profile']:>5.1f}{r['load_after']:>5.1f}"
            f"  {r['worst_term']}"
        )


def _run(row: dict) -> str:
    """A run's place: its cycle (a fresh profile), and its turn within the cycle."""
    return f"{row['cycle'] + 1}.{row['turn'] + 1}"


def print_medians(rows: list[dict], cores: int) -> None:
    """Each spec, rank count and plan: the median measured/predicted over the repeats."""
    groups: dict[tuple[str, int, str], list[float]] = {}
    for r in rows:
        groups.setdefault((r["spec"], r["ranks"], r["plan"]), []).append(
            r["measured_s"] / r["predicted_s"]
        )
    print("\nmedian over the runs (each cycle a fresh profile, each turn a fresh run)")
    print(f"{'spec':<15}{'ranks':>6}  {'plan':<11}{'meas/pred':>10}  {'spread':<11}  target")
    for (spec, ranks, plan), ratios in groups.items():
        mid = statistics.median(ratios)
        print(
            f"{spec:<15}{ranks:>6}  {plan:<11}{mid:>10.2f}  {min(ratios):.2f}-{max(ratios):.2f}"
            f"    {_verdict(mid, ranks, cores)} (within {_limit(ranks, cores):.0%})"
        )


def print_default_vs_sequential(rows: list[dict]) -> None:
    print("\nmeasured default / measured sequential (target: at most 1.10)")
    per_case: dict[tuple[str, int], list[float]] = {}
    for (name, n, _cycle, _turn), case in _by_pair(rows).items():
        if {"default", "sequential"} <= case.keys():
            ratio = case["default"]["measured_s"] / case["sequential"]["measured_s"]
            per_case.setdefault((name, n), []).append(ratio)
    for (name, n), ratios in per_case.items():
        mid = statistics.median(ratios)
        each = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"  {name}@{n}: {mid:.2f}  {'ok' if mid <= 1.10 else 'SLOWER'}  ({each})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), metavar="SPEC@N")
    ap.add_argument(
        "--repeat", type=int, default=1, metavar="R", help="run every case R times (default 1)"
    )
    ap.add_argument(
        "--turns",
        type=int,
        default=1,
        metavar="T",
        help="train each cycle's two plans T times, alternating (default 1)",
    )
    ap.add_argument(
        "--tp",
        type=int,
        metavar="K",
        help="plan with --tp K: every entry of a kind that splits K-way runs K-way",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument(
        "--keep",
        metavar="DIR",
        help="keep the profiles, plans, traces and summaries here (for spindle compare)",
    )
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    load_before = os.getloadavg()[0]
    cases = []
    for case in args.cases:
        name, _, n = case.partition("@")
        if name not in SPECS or not n.isdigit():
            sys.exit(f"unknown case {case!r} (known specs: {', '.join(SPECS)}; write SPEC@N)")
        if not SPECS[name].exists():
            print(f"skipping {case}: {SPECS[name]} is absent", file=sys.stderr)
            continue
        cases.append((name, int(n)))
    rows = []
    with tempfile.TemporaryDirectory(prefix="predict-accuracy-") as scratch:
        tmp = args.keep or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for cycle in range(max(1, args.repeat)):  # repeats interleaved: drift spreads over all
            for name, n in cases:
                rows += run_case(name, n, args.steps, Path(tmp), cycle, args.turns, args.tp)
    load_after = os.getloadavg()[0]
    print(
        f"\npredicted vs measured step time: gloo workers on {cores} CPU cores, float32, "
        f"median of steps 2..{args.steps}; load average {load_before:.1f} before, "
        f"{load_after:.1f} after; drift: the machine's speed at the run over at the profile"
        + (f"; planned with --tp {args.tp}" if args.tp else "")
    )
    print_rows(rows, cores)
    if args.repeat * args.turns > 1:
        print_medians(rows, cores)
    print_default_vs_sequential(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
