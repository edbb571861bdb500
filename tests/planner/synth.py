"""Test doubles: synthetic problems, MetaGraphs and a cost model with the planner's shapes.

T(n) = a + b / n^0.9 + ring all-reduce of the layer's gradients over n devices (a fixed cost
plus a jump once a group leaves its node), the shape an analytic model gives; memory is
parameters + optimizer state on every device plus activations split over the devices.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from spindle_dsl.cluster import PRESETS, Cluster
from spindle_dsl.cost.base import Curve, Curves
from spindle_dsl.metagraph import MetaGraph, MetaOp, ModuleInfo, OpInput, TaskInfo
from spindle_dsl.planner.model.problem import OpSpec, Problem


def curve_seconds(a: float, b: float, grad: float, n: int, per_node: int) -> float:
    ring = 0.0 if n == 1 else grad * 2 * (n - 1) / n
    if n > per_node:
        ring *= 4
    return a + b / n**0.9 + ring


def synth_op(
    op_id: str, layers: int, deps: Sequence[str], N: int, b: float, *, a: float = 1e-3
) -> OpSpec:
    ns = tuple(range(1, N + 1))
    return OpSpec(
        op_id,
        layers,
        tuple(deps),
        ns,
        tuple(curve_seconds(a, b, b * 0.002, n, 8) for n in ns),
        task=op_id.split("/")[0],
    )


def random_problem(rng: random.Random, N: int, n_ops: int) -> Problem:
    ops: list[OpSpec] = []
    for i in range(n_ops):
        deps = sorted({ops[j].id for j in range(i) if rng.random() < 0.25})[:3]
        ops.append(synth_op(f"t{i}/m{i}", rng.randint(1, 40), deps, N, b=rng.uniform(0.01, 2.0)))
    return Problem(tuple(ops), N)


@dataclass(frozen=True)
class SynthCost:
    """A CostModel for tests: the curves above, simple memory, alpha-beta communication."""

    cluster: Cluster
    seconds_per_flop: float = 1 / 1e14
    max_n: int | None = None

    def curves(self, graph: MetaGraph) -> Curves:
        out = []
        N = self.cluster.devices
        for op in graph.metaops:
            top = min(N, op.batch, self.max_n or N)
            ns = tuple(range(1, top + 1))
            b = 3 * op.forward_flops_per_layer * self.seconds_per_flop
            grad = op.param_bytes_per_layer / self.cluster.device.intra_bandwidth
            secs = tuple(curve_seconds(1e-4, b, grad, n, self.cluster.devices_per_node) for n in ns)
            out.append(Curve(op.id, ns, secs))
        return Curves(tuple(out), "synthetic")

    def memory_bytes(self, op: MetaOp, n: int, layers: int) -> int:
        state = 8 * op.param_bytes_per_layer * layers
        acts = op.batch * op.tokens * op.out_width * 2 * 8 * layers // n
        return int(state + acts)

    def transfer_seconds(self, nbytes: float, src, dst, cluster: Cluster) -> float:
        if set(src) == set(dst):
            return 0.0
        bw = (
            cluster.device.inter_bandwidth
            if cluster.spans_nodes([*src, *dst])
            else (cluster.device.intra_bandwidth)
        )
        return 1e-5 + nbytes / max(len(dst), 1) / bw

    def allreduce_seconds(self, nbytes: float, devices, cluster: Cluster) -> float:
        n = len(devices)
        if n <= 1:
            return 0.0
        bw = (
            cluster.device.inter_bandwidth
            if cluster.spans_nodes(devices)
            else (cluster.device.intra_bandwidth)
        )
        return 1e-5 + 2 * (n - 1) / n * nbytes / bw


def make_graph(
    tasks: dict[str, list[list[tuple[str, int, float]]]],
    *,
    devices: int = 16,
    per_node: int = 8,
    batch: int = 64,
    device: str = "a100-80gb",
) -> MetaGraph:
    """A MetaGraph from ``{task: [chain, ...]}``; a chain is [(module, layers, gflops), ...].

    Chains of one task that name the same module merge into one MetaOp, so two chains ending
    in ``lm`` make ``lm`` consume both; a module named in several tasks is shared.
    """
    ops: dict[str, dict] = {}
    modules: dict[str, dict] = {}
    task_infos = []
    for task, chains in tasks.items():
        sinks: list[str] = []
        for chain in chains:
            prev: str | None = None
            for module, layers, gflops in chain:
                oid = f"{task}/{module}"
                rec = ops.setdefault(
                    oid,
                    {
                        "task": task,
                        "module": module,
                        "layers": layers,
                        "gflops": gflops,
                        "inputs": [],
                    },
                )
                if prev is not None and prev not in rec["inputs"]:
                    rec["inputs"].append(prev)
                modules.setdefault(module, {"layers": layers, "tasks": []})
                if task not in modules[module]["tasks"]:
                    modules[module]["tasks"].append(task)
                prev = oid
            assert prev is not None
            if prev not in sinks:
                sinks.append(prev)
        task_infos.append(TaskInfo(task, batch, None, "lm", tuple(sinks)))
    level: dict[str, int] = {}
    order: list[str] = []
    pending = list(ops)
    while pending:
        for oid in list(pending):
            if all(i in level for i in ops[oid]["inputs"]):
                level[oid] = 1 + max((level[i] for i in ops[oid]["inputs"]), default=-1)
                pending.remove(oid)
    order = sorted(ops, key=lambda o: level[o])
    width = 256
    metaops = []
    for oid in order:
        r = ops[oid]
        inputs = tuple(OpInput(i, False, 32) for i in r["inputs"]) or (OpInput("data", True, 32),)
        metaops.append(
            MetaOp(
                id=oid,
                task=r["task"],
                module=r["module"],
                segments=((r["module"], r["layers"]),),
                kind="transformer",
                args=(("layers", r["layers"]),),
                layers=r["layers"],
                batch=batch,
                tokens=32 * len(inputs),
                out_tokens=32 * len(inputs),
                in_width=width,
                out_width=width,
                inputs=inputs,
                level=level[oid],
                frozen=False,
                needs_backward=True,
                forward_flops_per_layer=r["gflops"] * 1e9,
                params_per_layer=1_000_000,
                param_bytes_per_layer=2_000_000,
            )
        )
    mods = tuple(
        ModuleInfo(
            name,
            "transformer",
            (("layers", m["layers"]),),
            False,
            None,
            tuple(m["tasks"]),
            1_000_000 * m["layers"],
        )
        for name, m in modules.items()
    )
    cluster = Cluster(devices, min(per_node, devices), PRESETS[device])
    return MetaGraph(tuple(metaops), tuple(task_infos), mods, (), cluster, None, 2, "synthetic")


def random_graph(rng: random.Random, devices: int, n_tasks: int) -> MetaGraph:
    shared = [("llm", rng.randint(2, 24), rng.uniform(50, 400))]
    encoders = [(f"enc{i}", rng.randint(1, 24), rng.uniform(5, 300)) for i in range(4)]
    tasks: dict[str, list[list[tuple[str, int, float]]]] = {}
    for t in range(n_tasks):
        chains = []
        for enc in rng.sample(encoders, rng.randint(1, 2)):
            chain = [enc]
            if rng.random() < 0.5:
                chain.append((f"proj{t}", 1, rng.uniform(0.1, 5)))
            chain.append(shared[0])
            chains.append(chain)
        tasks[f"task{t}"] = chains
    return make_graph(tasks, devices=devices, per_node=min(8, devices))


def count_calls(monkeypatch, owner: object, name: str) -> list[int]:
    """``owner.name`` replaced (for the test) by itself counting: one item per call from now
    on, in the list returned."""
    calls: list[int] = []
    real = getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls
