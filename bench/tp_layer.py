"""One LM layer of a spec, data parallel against tensor parallel, predicted and measured.

For each world size W in ``--worlds`` (default 1, 2, 4), W gloo worker processes run the
spec's MetaOp ``--metaop`` (default ``chat/lm`` of cpu_medium) for one layer, forward and
backward, two ways, interleaved repetition by repetition: data parallel (each rank its
``ceil(batch / W)`` rows, the layer whole) and tensor parallel (every rank all the rows, its
``W``-way slice of the layer through the runtime's ``ShardView``). It prints the median
seconds of rank 0 beside the analytic cost model's price of the same layout (compute plus
the tensor-parallel all-reduces; the gradient reduction, which both layouts pay in full in this
runtime, is left out of both), and the bytes of activations autograd keeps for the backward on
rank 0 beside the memory model's ``kept`` term for one layer of that layout (the weights are
held whole in both layouts, so the activations are what tensor parallelism changes). Over 2
cores, W = 4 shares the cores.

    .venv/bin/python bench/tp_layer.py [SPEC] [--metaop chat/lm] [--worlds 1 2 4] [--repeat 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = REPO.parent / "shared" / "spec" / "cpu_medium.spindle"


def _rank(rank: int, world: int, port: int, spec: str, metaop: str, repeat: int, out) -> None:
    import torch
    import torch.distributed as dist

    from spindle_dsl.backends.torch.tensor_parallel import ShardView
    from spindle_dsl.kinds import get_kind
    from spindle_dsl.language import compile_file

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    op = compile_file(spec).graph.op(metaop)
    kind = get_kind(op.kind)
    torch.manual_seed(0)
    layer = kind.build_layer(kind.resolve(dict(op.args)), last=False)
    rows = torch.randn(op.batch, kind.layer_tokens(dict(op.args), op.tokens), op.in_width)
    shard = -(-op.batch // world)
    mine = rows[rank * shard : (rank + 1) * shard]
    view = ShardView(layer, rank, world, None) if world > 1 else None

    def step(module, x) -> float:
        dist.barrier()
        t = time.perf_counter()
        x = x.clone().requires_grad_()
        module(x).sum().backward()
        dist.barrier()  # the slowest rank sets the time
        return time.perf_counter() - t

    times: dict[str, list[float]] = {"dp": [], "tp": []}
    for _ in range(repeat + 3):  # three warm-up rounds
        times["dp"].append(step(layer, mine))
        if view is not None:
            times["tp"].append(step(view, rows))
    kept = {"dp": _kept_bytes(layer, layer, mine)}
    if view is not None:
        kept["tp"] = _kept_bytes(layer, view, rows)
    if rank == 0:
        out.put({k: (statistics.median(v[3:]), kept[k]) for k, v in times.items() if v})
    dist.destroy_process_group()


def _kept_bytes(layer, module, x) -> int:
    """Bytes of the activations autograd keeps from ``module``'s forward until its backward
    (each storage once, the layer's own parameters and their slices left out): the rank's
    ``kept`` term of the memory model for one layer."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    x = x.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = module(x)
    y.sum().backward()
    return sum(kept.values())


def _measure(world: int, spec: str, metaop: str, repeat: int) -> dict[str, float]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = 29600 + (os.getpid() + world) % 300
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, spec, metaop, repeat, out))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    got = out.get(timeout=600)
    for p in procs:
        p.join()
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="?", default=str(DEFAULT_SPEC))
    ap.add_argument("--metaop", default="chat/lm")
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()

    from spindle_dsl.cost.analytic import price
    from spindle_dsl.cost.memory import op_memory_info, slice_activations
    from spindle_dsl.language import compile_file

    graph = compile_file(args.spec).graph
    op = graph.op(args.metaop)
    info = op_memory_info(graph, op)
    cluster = graph.cluster.with_overrides(devices=max(args.worlds))
    print(
        f"{Path(args.spec).name} {args.metaop}: one layer, batch {op.batch}, {op.tokens} tokens, "
        f"width {op.in_width}; median of {args.repeat} forward+backward on rank 0 (ms); "
        f"activations kept for the backward on rank 0 (MiB)"
    )
    print(
        f"{'ranks':>5} {'layout':>8} {'predicted':>10} {'measured':>9} {'meas/pred':>9}"
        f" {'kept pred':>10} {'kept meas':>10} {'meas/pred':>9}"
    )
    for world in args.worlds:
        measured = _measure(world, args.spec, args.metaop, args.repeat)
        layouts = {"dp": (world, 1), "tp": (1, world)}
        for name, (seconds, kept) in measured.items():
            dp, tp = layouts[name]
            c = price(op, dp, tp, cluster)
            predicted = c.compute_s + c.tp_comm_s
            kept_pred = slice_activations(op, 1, dp, tp, cluster, False, info)[0]
            print(
                f"{world:>5} {f'{dp}x{tp}':>8} {predicted * 1e3:>10.2f} {seconds * 1e3:>9.2f} "
                f"{seconds / predicted:>9.2f} {kept_pred / 2**20:>10.2f} {kept / 2**20:>10.2f} "
                f"{kept / kept_pred:>9.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
