"""How much of a measured training step is runtime overhead: time outside forward, backward and
the losses, per rank, read from the run's measured Chrome trace.

Trains ``SPEC`` with ``spindle train --nproc N --trace`` for each scheduler asked (each its own
run), then sums the trace's spans per rank and category over steps 2..S (step 1 pays for warm-up):
forward, backward and loss are the work the plan prices; exchange (activation and gradient transfers
between waves, including the wait for the producing rank), reduce (issuing and waiting for gradient
collectives, and the optimizer's all-gather), optimizer (the AdamW update) and other (the rest of
the step: the executor's own Python, the end-of-step loss all-reduce that lines the ranks up,
heartbeats) are overhead. The last column is the share of the step outside forward, backward and
loss: the target is at most 15% on cpu_medium with 2 ranks. Waiting for a slower rank counts as
overhead there (it is time the rank spends outside its own work), so a plan whose ranks are
unbalanced on this machine shows it: on a shared virtual machine the same matmul loop pinned to each
of two cores, side by side, can run slower on one core than on the other, by a ratio that changes
from one minute to the next, and a layer's time moves the same way, so one run's waits say as much
about the machine as about the runtime. Hence a second figure, ``beyond``: the share of the step
that no rank's own forward, backward and loss explain, the step less the busiest rank's work. No
runtime could run these ranks, at the speeds they ran, in less than that rank's work, so ``beyond``
is what the runtime itself adds to the step (every rank's waits, copies and bookkeeping that the
busiest rank pays); the worst rank's ``outside`` adds the imbalance on top. ``--repeat R`` trains
each plan R times in turns and prints the median; ``--profile`` plans with measured curves, as
``spindle train --profile`` does.

    .venv/bin/python bench/runtime_overhead.py [SPEC] [--nproc 2] [--steps 10]
                                               [--scheduler default sequential] [--keep DIR]
                                               [--profile PROFILE.json] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = REPO.parent / "shared" / "spec" / "cpu_medium.spindle"
WORK = ("forward", "backward", "loss")
OVERHEAD = ("exchange", "reduce", "optimizer", "other")
SPANNED = (*WORK, *OVERHEAD[:-1])  # the categories that tile a step (``other``: the rest)


def step_sums(trace: dict, first_step: int = 2) -> dict[int, dict[str, float]]:
    """Per rank: seconds per category summed over steps ``first_step``.., with ``step`` the
    steps' own total and ``other`` what no span inside a step covers."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e.get("cat") == "step"]
    sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") != "step":
            by_rank[e["tid"]].append(e)
    for s in steps:
        if int(s["name"].split()[1]) < first_step:
            continue
        rank, lo, hi = s["tid"], s["ts"], s["ts"] + s["dur"]
        out = sums[rank]
        out["step"] += s["dur"] / 1e6
        covered = 0.0
        # (spans of other categories lie inside these: a spread loss's "loss rows")
        mine = [
            e
            for e in by_rank[rank]
            if e["cat"] in SPANNED and lo <= e["ts"] and e["ts"] + e["dur"] <= hi + 1.0
        ]
        for e in mine:
            out[e["cat"]] += e["dur"] / 1e6
            covered += e["dur"] / 1e6
            # a span inside another (a bucket issued from a gradient hook during a stage's
            # backward) is its own category's time, not the enclosing span's
            parent = _enclosing(e, mine)
            if parent is not None:
                out[parent["cat"]] -= e["dur"] / 1e6
                covered -= e["dur"] / 1e6
        out["other"] += s["dur"] / 1e6 - covered
    return {r: dict(v) for r, v in sorted(sums.items())}


def _enclosing(span: dict, spans: list[dict]) -> dict | None:
    """The shortest span of ``spans`` (one rank's) that contains ``span``, if any."""
    lo, hi = span["ts"], span["ts"] + span["dur"]
    around = [
        e
        for e in spans
        if e is not span and e["ts"] <= lo and hi <= e["ts"] + e["dur"] and e["dur"] > span["dur"]
    ]
    return min(around, key=lambda e: e["dur"], default=None)


def table(sums: dict[int, dict[str, float]], steps: int) -> tuple[list[str], float, float]:
    """The printed rows (ms per step), the largest overhead share over the ranks, and the
    share of the step beyond the busiest rank's work (module docstring)."""
    cols = (*WORK, *OVERHEAD)
    lines = [f"{'rank':<6}{'step ms':>9}" + "".join(f"{c:>10}" for c in cols) + f"{'outside':>10}"]
    shares = []
    for rank, s in sums.items():
        step = s.get("step", 0.0)
        outside = step - sum(s.get(c, 0.0) for c in WORK)
        share = outside / step if step else 0.0
        shares.append(share)
        row = f"{rank:<6}{1e3 * step / steps:>9.1f}"
        row += "".join(f"{1e3 * s.get(c, 0.0) / steps:>10.1f}" for c in cols)
        lines.append(row + f"{100 * share:>9.1f}%")
    # the busiest rank has the least time outside its own work
    return lines, max(shares, default=0.0), min(shares, default=0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="?", default=str(DEFAULT_SPEC))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--scheduler", nargs="+", default=["default"])
    ap.add_argument("--plan", help="run this plan file instead of planning")
    ap.add_argument("--profile", help="plan with this `spindle profile` output (measured curves)")
    ap.add_argument("--keep", help="write the traces and summaries into this folder")
    ap.add_argument(
        "--repeat", type=int, default=1,
        help="train each plan this many times, in turns (A B A B ...), and print the median",
    )  # fmt: skip
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: more train flags")
    args = ap.parse_args()

    from spindle_dsl.cli import main as spindle

    folder = Path(args.keep or tempfile.mkdtemp(prefix="overhead-"))
    folder.mkdir(parents=True, exist_ok=True)
    extra = [a for a in args.train_args if a != "--"]
    runs = [("plan file", ["--plan", args.plan])] if args.plan else []
    runs += [(s, ["--scheduler", s]) for s in args.scheduler if not args.plan]
    if args.profile:
        extra += ["--profile", args.profile]
    print(
        f"{Path(args.spec).name}: {args.nproc} gloo ranks on {os.cpu_count()} CPU cores, "
        f"ms per step averaged over steps 2..{args.steps} of the measured trace"
    )
    shares: dict[str, list[float]] = defaultdict(list)
    beyonds: dict[str, list[float]] = defaultdict(list)
    for turn in range(1, args.repeat + 1):
        for name, source in runs:
            tag = name if args.repeat == 1 else f"{name}-{turn}"
            trace, summary = folder / f"trace-{tag}.json", folder / f"summary-{tag}.json"
            code = spindle(
                ["train", args.spec, "--nproc", str(args.nproc), "--steps", str(args.steps),
                 "--trace", str(trace), "--summary-json", str(summary), "--no-progress",
                 *source, *extra]
            )  # fmt: skip
            if code:
                return code
            sums = step_sums(json.loads(trace.read_text()))
            lines, worst, beyond = table(sums, args.steps - 1)
            shares[name].append(worst)
            beyonds[name].append(beyond)
            print(
                f"\n{tag}: time outside forward, backward and loss, worst rank {worst:.1%}; "
                f"beyond the busiest rank's work {beyond:.1%}"
            )
            print("\n".join(lines))
    if args.repeat > 1:
        for title, got_by in (
            ("worst rank's share outside forward, backward and loss", shares),
            ("share of the step beyond the busiest rank's work", beyonds),
        ):
            print(f"\n{title}, run by run (median)")
            for name, got in got_by.items():
                runs_pct = ", ".join(f"{100 * x:.1f}%" for x in got)
                print(f"  {name:<12}{runs_pct}  (median {100 * statistics.median(got):.1f}%)")
    print(f"\ntraces: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
