"""Planning time and peak memory at scale, against their targets, each case in a fresh process.

    .venv/bin/python bench/scale.py [--quick]

Rows: the OFASys-like 7-task encoder-decoder job (``bench/specs/ofasys_7task.spindle``: a
4-layer vit stem, a shared 12-layer encoder and decoder at hidden 1024, global batch 1536) at
1,024 to 65,536 devices (target: 65,536 in under 20 s and 1 GB), and generated specs of 50
tasks (``synthetic_spec.py``, global batch 16 per device) at 1,024 (target: under 10 s) to
65,536 devices. Each row is
``spindle plan`` as a user runs it (default scheduler and time limit, memory enforced) in its
own interpreter, so the peak resident memory is that plan's alone, and in that one process
(``jobs=0``: no planning helpers for the runner-up rounds, ``planner.search.helpers``, whose
memory its peak would not count, and whose number would depend on the cores left spare).
``--quick`` keeps the rows at 1,024 and 65,536 devices.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OFASYS = HERE / "specs" / "ofasys_7task.spindle"

_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from synthetic_spec import synthetic_spec
from spindle_dsl.cost import make_cost_model
from spindle_dsl.errors import SpindleError
from spindle_dsl.language import compile_file, compile_text
from spindle_dsl.planner import make_plan

what, devices = sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
if what == "ofasys":
    graph = compile_file(sys.argv[4], cluster_overrides={"devices": devices}).graph
else:
    tasks = int(what)
    graph = compile_text(synthetic_spec(devices, tasks), f"<synthetic {devices}x{tasks}>").graph
try:
    plan = make_plan(graph, make_cost_model(graph.cluster), jobs=0)
    result = {"iteration_s": plan.iteration_s, "chosen": plan.solver.name}
except SpindleError as exc:
    result = {"error": str(exc).splitlines()[0][:80]}
result["wall_s"] = time.perf_counter() - t0
result["metaops"] = len(graph.metaops)
result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(result))
"""


def run(what: str, devices: int) -> dict:
    args = [sys.executable, "-c", _CHILD, str(HERE), what, str(devices), str(OFASYS)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:80]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,024 and 65,536 devices only")
    args = parser.parse_args()
    sizes = (1024, 65536) if args.quick else (1024, 4096, 16384, 65536)
    rows = [("ofasys", n) for n in sizes] + [("50", n) for n in sizes]
    print(f"{'workload':<24} {'devices':>8} {'MetaOps':>8} {'plan s':>8} {'peak MiB':>9}  result")
    for what, n in rows:
        r = run(what, n)
        label = "OFASys-like 7 tasks" if what == "ofasys" else f"synthetic {what} tasks"
        result = r.get("error") or f"{r['iteration_s'] * 1e3:.1f} ms/iteration ({r['chosen']})"
        wall = f"{r['wall_s']:.2f}" if "wall_s" in r else "-"
        peak = f"{r['peak_mib']:.0f}" if "peak_mib" in r else "-"
        print(
            f"{label:<24} {n:>8} {r.get('metaops', '-'):>8} {wall:>8} {peak:>9}  {result}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
