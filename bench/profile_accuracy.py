"""How well do profile-fitted curves predict layer times at batch sizes the fit never saw?

Profiles a spec (default: tiny_mm) exactly as ``spindle profile`` does, then times every
MetaOp shape afresh at per-device batch sizes that were not among the fitted points (between
them and beyond the largest), and prints predicted vs measured milliseconds and the relative
error. Exits 1 if any error exceeds ``--tolerance`` (default 25%).

    .venv/bin/python bench/profile_accuracy.py [SPEC] [--device cpu|cuda] [--threads 1]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

from spindle_dsl.cost.analytic import backward_multiplier
from spindle_dsl.cost.profiler import TimingBudget, layer_runner, profile_graph, time_layer
from spindle_dsl.kinds import get_kind
from spindle_dsl.language import compile_file

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPECS = (
    ROOT / "examples" / "tiny_mm.spindle",
    ROOT / ".." / "shared" / "spec" / "tiny_mm.spindle",
)


def held_out_batches(fitted: list[int]) -> list[int]:
    """Batch sizes strictly between fitted points (geometric midpoints) and 1.5x the largest."""
    out = set()
    for lo, hi in itertools.pairwise(fitted):
        mid = round((lo * hi) ** 0.5)
        if lo < mid < hi:
            out.add(mid)
    out.add(round(fitted[-1] * 1.5))
    return sorted(b for b in out if b not in fitted)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", help="a .spindle file (default: tiny_mm)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tolerance", type=float, default=0.25)
    args = parser.parse_args()
    spec = Path(args.spec) if args.spec else next((p for p in DEFAULT_SPECS if p.exists()), None)
    if spec is None:
        print("no spec given and no tiny_mm.spindle found", file=sys.stderr)
        return 2
    graph = compile_file(spec).graph
    start = time.perf_counter()
    profile = profile_graph(graph, device=args.device, threads=args.threads)
    fit_s = time.perf_counter() - start
    budget = TimingBudget(min_seconds=0.3)
    rows, errors = [], []
    for entry in profile.entries:
        op = next(o for o in graph.metaops if o.id == entry.metaops[0])
        args_ = dict(entry.args)
        per_sample = backward_multiplier(op) * get_kind(entry.kind).forward_flops(
            args_, entry.tokens
        )
        for b in held_out_batches([s.batch for s in entry.samples]):
            predicted = entry.fit.predict(per_sample * b)
            step = layer_runner(entry.kind, args_, entry.tokens, entry.mode, b, device=args.device)
            measured = time_layer(step, budget)
            err = predicted / measured - 1.0
            errors.append(abs(err))
            rows.append((op.id, entry.mode, b, predicted * 1e3, measured * 1e3, err * 100))
    print(
        f"{spec.name} on {profile.device_name} ({profile.threads} thread(s)): "
        f"profile took {fit_s:.1f} s; {len(rows)} held-out points"
    )
    print(f"{'metaop':<26} {'mode':<10} {'batch':>5} {'pred ms':>9} {'meas ms':>9} {'err %':>7}")
    for metaop, mode, b, pred, meas, err in rows:
        print(f"{metaop:<26} {mode:<10} {b:>5} {pred:>9.3f} {meas:>9.3f} {err:>+7.1f}")
    worst = max(errors) if errors else 0.0
    print(
        f"median |error| {statistics.median(errors) * 100:.1f}%, worst {worst * 100:.1f}% "
        f"(tolerance {args.tolerance * 100:.0f}%)"
    )
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
