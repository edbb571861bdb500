"""A driver the multi-process tests run as a script: train a hand-built graph with --nproc.

Run as ``python run_job.py --world 4 --steps 5 ...``; prints the result's losses as JSON on
stdout and, like the CLI, a SpindleError's message on stderr with exit code 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import handgraph as h

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import TorchBackend
from spindle_dsl.errors import SpindleError


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", default="tiny_mm", choices=("tiny_mm", "clip_like"))
    ap.add_argument("--plan", default="hand", choices=("hand", "sequential"))
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--hang-timeout", type=float, default=45.0)
    ap.add_argument("--checkpoint-dir")
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--log-json")
    args = ap.parse_args()
    graph = getattr(h, args.graph)(args.world)
    if args.plan == "sequential":
        plan = h.sequential_plan(graph)
    else:
        plan = h.make_plan(graph, h.TINY_WAVES if args.graph == "tiny_mm" else h.CLIP_WAVES)
    config = RunConfig(
        steps=args.steps,
        dtype=args.dtype,
        step_delay_s=args.delay,
        hang_timeout_s=args.hang_timeout,
        collective_timeout_s=max(args.hang_timeout + 10, 20),
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        log_json=args.log_json,
        progress=False,
    )
    try:
        result = TorchBackend().train(graph, plan, config, nproc=args.world)
    except SpindleError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    print(
        json.dumps({"steps": [s.to_json() for s in result.steps], "resumed": result.resumed_from})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
