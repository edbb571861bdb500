"""Is the analytic model physically plausible at paper scale?

For each paper workload (Multitask-CLIP, QWen-VAL) and 8, 16, 32 and 64 devices of the spec's
device, prints the sequential all-devices iteration time (every MetaOp in turn on all N
devices: sum of L_m * T_m(N)), its FLOP floor (all work at the dense peak), the achieved
fraction of peak and the speed-up over 8 devices; checks that no T_m(n) beats its FLOPs at
peak; and prints the curves of the smallest and the largest MetaOp (by FLOPs of all layers).

    .venv/bin/python bench/analytic_scaling.py [SPEC...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.analytic import AnalyticCostModel, backward_multiplier
from spindle_dsl.language import compile_file

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / ".." / "shared" / "spec"
DEVICE_COUNTS = (8, 16, 32, 64)
CURVE_NS = (1, 2, 4, 8, 16, 32, 64)


def main() -> int:
    specs = [Path(p) for p in sys.argv[1:]] or [
        SHARED / "multitask_clip.spindle",
        SHARED / "qwen_val.spindle",
    ]
    violations = 0
    for spec in specs:
        print(f"== {spec.name}")
        print(f"{'N':>3} {'sequential s':>13} {'FLOP floor s':>13} {'% of peak':>10} {'vs N=8':>7}")
        base = None
        for n_dev in DEVICE_COUNTS:
            graph = compile_file(spec, cluster_overrides={"devices": n_dev}).graph
            cost = make_cost_model(graph.cluster)
            curves = cost.curves(graph)
            peak = graph.cluster.device.peak_flops
            seq = floor = 0.0
            for op in graph.metaops:
                work = backward_multiplier(op) * op.forward_flops_per_layer
                for n, t in curves[op.id].items():
                    if t < work / (n * peak):
                        violations += 1
                        print(f"   VIOLATION {op.id} n={n}: {t} < {work / (n * peak)}")
                seq += op.layers * curves[op.id].at(n_dev)
                floor += op.layers * work / (n_dev * peak)
            base = base or seq
            print(
                f"{n_dev:>3} {seq:>13.3f} {floor:>13.3f} {100 * floor / seq:>9.1f}% "
                f"{base / seq:>6.2f}x"
            )
        ops = sorted(graph.metaops, key=lambda o: o.layers * o.forward_flops_per_layer)
        assert isinstance(cost, AnalyticCostModel)
        for label, op in (("smallest", ops[0]), ("largest", ops[-1])):
            total = op.layers * op.forward_flops_per_layer
            print(
                f"{label} MetaOp {op.id} ({op.kind}, L={op.layers}, batch {op.batch}, "
                f"{op.tokens} tokens, {total / 1e12:.3g} TFLOP forward over all layers):"
            )
            for n in CURVE_NS:
                cfg = cost.config(op, n)
                print(
                    f"   T({n:>2}) = {cfg.seconds * 1e3:10.3f} ms  dp={cfg.dp:<3} tp={cfg.tp} "
                    f"compute {cfg.compute_s * 1e3:.3f} tp-comm {cfg.tp_comm_s * 1e3:.3f} "
                    f"grad-sync {cfg.grad_sync_s * 1e3:.3f}"
                )
    print(f"physical floor violations: {violations}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
