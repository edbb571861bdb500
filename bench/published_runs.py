"""The GPU presets against published training runs: each run's tokens per second per GPU
beside what ``spindle plan`` predicts for the same model, batch and layout.

    .venv/bin/python bench/published_runs.py [--markdown]

A run is re-planned as it was run: one task (the LM on its sequence length) at the run's
global batch on the run's GPUs, data parallel over all of them (``--tp 1``: the runs used
FSDP, no tensor parallelism), the optimizer state and gradients sharded (ZeRO-2, the nearest
lever to FSDP's full sharding) and activation recompute chosen by the planner's memory search
(the runs recomputed selected activations). The prediction is ``global batch x sequence /
iteration / GPUs``; the table also shows how much of the iteration is the layers' gradient
reduction, which the analytic model adds to each layer's time where FSDP overlaps most of it
with the backward pass. The published figures are torchtitan's (``docs/performance.md`` of
github.com/pytorch/torchtitan): the A100 run on 80 GB SXM parts; the H100 run on Grand Teton
hosts (96 GB HBM2e H100s at a 500 W power limit), which the H100-80GB preset (700 W SXM
figures) does not model.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.analytic import price
from spindle_dsl.language import compile_file
from spindle_dsl.planner import make_plan

# Llama 3 8B (and 3.1 8B: the same shapes; the longer RoPE context does not change the cost)
LLAMA3_8B = (
    "transformer(layers = 32, hidden = 4096, heads = 32, kv_heads = 8, ffn = 14336, "
    'act = "swiglu", norm = "rmsnorm", bias = false, qkv_bias = false, pos = "rotary", '
    "rope_theta = 500000, causal = true, vocab = 128256)"
)


@dataclass(frozen=True)
class PublishedRun:
    """One published training run and what it reported."""

    name: str
    device: str  # the spindle preset of its GPUs
    gpus: int
    local_batch: int  # sequences per GPU per step
    sequence: int
    tokens_per_s_per_gpu: float  # as published
    where: str  # the table it comes from

    def spec(self) -> str:
        return (
            f'cluster {{ devices = {self.gpus}; device = "{self.device}"; '
            f"devices_per_node = 8 }}\n"
            f"modality text {{ tokens = {self.sequence}; vocab = 128256 }}\n"
            f"module llm : {LLAMA3_8B}\n"
            f"task pretrain {{ text -> llm; loss = lm; batch = {self.gpus * self.local_batch} }}\n"
        )


RUNS = (
    PublishedRun(
        "Llama 3 8B, FSDP, selective op AC", "A100-80GB", 64, 1, 8192, 2973.0,
        "torchtitan docs/performance.md, Llama 3 on 64 A100 (80GB)",
    ),
    PublishedRun(
        "Llama 3.1 8B, FSDP, selective AC", "H100-80GB", 8, 2, 8192, 5762.0,
        "torchtitan docs/performance.md, Table 1 (8 H100, no torch.compile)",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class Prediction:
    run: PublishedRun
    iteration_s: float
    tokens_per_s_per_gpu: float
    layout: str
    grad_sync_s: float  # of the iteration: the layers' gradient reduction, priced unoverlapped


def predict(run: PublishedRun, folder: Path) -> Prediction:
    """Plan ``run``'s job as the run was laid out and read its throughput."""
    path = folder / f"{run.device}-{run.gpus}.spindle"
    path.write_text(run.spec())
    graph = compile_file(str(path)).graph
    plan = make_plan(graph, make_cost_model(graph.cluster, tp=1), scheduler="sequential",
                     zero_stage=2)  # fmt: skip
    tokens = run.gpus * run.local_batch * run.sequence
    recompute = any(m.recompute for m in plan.metaops)
    sync = sum(
        op.layers * price(op, run.gpus, 1, graph.cluster, recompute).grad_sync_s
        for op in graph.metaops
    )
    layout = (
        f"{run.gpus} x 1 (dp x tp), ZeRO-{plan.zero_stage}, "
        f"recompute {'on' if recompute else 'off'}, {plan.micro_batches} micro-batch(es)"
    )
    return Prediction(run, plan.iteration_s, tokens / plan.iteration_s / run.gpus, layout, sync)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [predict(run, Path(tmp)) for run in RUNS]
    head = ("run", "GPUs", "published tok/s/GPU", "predicted", "pred/published",
            "iteration s", "of it grad sync s", "planned as")  # fmt: skip
    lines = [
        (
            r.run.name,
            f"{r.run.gpus} x {r.run.device}",
            f"{r.run.tokens_per_s_per_gpu:,.0f}",
            f"{r.tokens_per_s_per_gpu:,.0f}",
            f"{r.tokens_per_s_per_gpu / r.run.tokens_per_s_per_gpu:.2f}",
            f"{r.iteration_s:.3f}",
            f"{r.grad_sync_s:.3f}",
            r.layout,
        )
        for r in rows
    ]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + " --- |" * len(head))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
        for line in (head, *lines):
            print("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())
    for r in rows:
        print(f"source: {r.run.where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
