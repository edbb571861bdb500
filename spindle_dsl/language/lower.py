"""Lower a checked spec to the MetaGraph the planner sees (docs/contracts.md, "Lowering rules").

One MetaOp per (task, module) that the task runs: ``layers`` identical layers with the task's
batch, the tokens its incoming edges bring, and per-layer FLOPs and parameter bytes from the
kind. Then Spindle's contraction: a chain a -> b inside one task whose layers are identical
(same kind and arguments but for ``layers``, same token counts, same frozen flag), where a feeds
only b, b reads only a, and no other task runs either module, is one operator to the planner,
so it becomes one MetaOp ``task/a+b`` with both layer counts added. Levels and backward needs
are computed last, on the contracted graph.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from spindle_dsl.errors import SpecError
from spindle_dsl.kinds import get_kind
from spindle_dsl.language.resolved import Checked, ResolvedModule, ResolvedTask
from spindle_dsl.metagraph import MetaGraph, MetaOp, ModuleInfo, OpInput, TaskInfo

T = TypeVar("T")


@dataclass
class _Op:
    """A MetaOp under construction (mutable while chains are contracted)."""

    task: str
    segments: list[tuple[str, int]]
    module: ResolvedModule
    batch: int
    tokens: int
    out_tokens: int
    inputs: list[OpInput]
    flops: float
    params: int
    order: int  # position in the task's topological order, for a stable output order
    consumers: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.task}/" + "+".join(name for name, _ in self.segments)


def lower(checked: Checked) -> MetaGraph:
    """The MetaGraph of a spec that passed ``check``."""
    dtype_bytes = 4 if checked.cluster.device.name.lower() == "cpu" else 2
    runs: dict[str, list[str]] = {}
    for t in checked.tasks:
        for m in t.modules:
            runs.setdefault(m, []).append(t.name)
    ops: dict[str, _Op] = {}
    sinks: dict[str, list[str]] = {}
    for ti, t in enumerate(checked.tasks):
        task_ops = _task_ops(checked, t, ti)
        _contract(task_ops, runs)
        ops.update(task_ops)
        last = {op.segments[-1][0]: op.id for op in task_ops.values()}
        sinks[t.name] = [last[m] for m in t.sinks]
    metaops = _freeze(ops, dtype_bytes)
    return MetaGraph(
        metaops=metaops,
        tasks=tuple(
            TaskInfo(t.name, t.batch, t.weight, t.loss, tuple(sinks[t.name]), t.data, t.eval_data)
            for t in checked.tasks
        ),
        modules=_module_infos(checked, runs),
        modalities=tuple(
            m
            for m in checked.modalities
            if any(e.from_modality and e.source == m.name for t in checked.tasks for e in t.edges)
        ),
        cluster=checked.cluster,
        mix=checked.mix,
        dtype_bytes=dtype_bytes,
        spec_path=checked.spec.path,
        spec_sha256=hashlib.sha256(checked.spec.source.encode("utf-8")).hexdigest(),
    )


def _kind_call(module: ResolvedModule, what: str, fn: Callable[..., T], *args: Any) -> T:
    """Ask a kind for a figure; a kind that raises or returns nonsense is the user's error."""
    try:
        value = fn(*args)
    except Exception as exc:  # a user kind may raise anything; never show a traceback
        raise SpecError(
            f"kind '{module.kind}' failed computing {what} of module '{module.name}': "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"kind '{module.kind}' gave {what} = {value!r} for module '{module.name}'")
    if value < 0:
        raise SpecError(f"kind '{module.kind}' gave negative {what} for module '{module.name}'")
    return value


def _topological(t: ResolvedTask) -> list[str]:
    """The task's modules, dependencies first, ties in order of appearance."""
    indeg = {m: 0 for m in t.modules}
    for e in t.edges:
        if not e.from_modality:
            indeg[e.target] += 1
    order: list[str] = []
    ready = [m for m in t.modules if indeg[m] == 0]
    while ready:
        m = ready.pop(0)
        order.append(m)
        for e in t.edges:
            if not e.from_modality and e.source == m:
                indeg[e.target] -= 1
                if indeg[e.target] == 0:
                    ready.append(e.target)
    assert len(order) == len(t.modules), f"task {t.name}: the checker let a cycle through"
    return order


def _task_ops(checked: Checked, t: ResolvedTask, task_index: int) -> dict[str, _Op]:
    ops: dict[str, _Op] = {}
    for position, name in enumerate(_topological(t)):
        module = checked.module(name)
        kind = get_kind(module.kind)
        args = module.argmap
        inputs: list[OpInput] = []
        for e in t.edges:
            if e.target != name:
                continue
            if e.from_modality:
                assert e.tokens is not None, "a modality edge carries its token count"
                inputs.append(OpInput(e.source, True, e.tokens))
            else:
                source = ops[f"{t.name}/{e.source}"]
                source.consumers.append(f"{t.name}/{name}")
                inputs.append(OpInput(source.id, False, source.out_tokens))
        tokens = sum(i.tokens for i in inputs)
        out_tokens = int(_kind_call(module, "out_tokens", kind.out_tokens, args, tokens))
        if out_tokens < 1:
            raise SpecError(f"kind '{module.kind}' gave module '{name}' no output tokens")
        flops = _kind_call(module, "forward FLOPs", kind.forward_flops, args, tokens)
        # what the last layer runs beyond its block (a pooling head), spread over the layers
        tail = _kind_call(module, "tail FLOPs", kind.tail_flops, args, tokens)
        flops += tail / max(int(args.get("layers", 1)), 1)
        params = int(_kind_call(module, "layer parameters", kind.layer_params, args))
        ops[f"{t.name}/{name}"] = _Op(
            task=t.name,
            segments=[(name, int(args.get("layers", 1)))],
            module=module,
            batch=t.batch,
            tokens=tokens,
            out_tokens=out_tokens,
            inputs=inputs,
            flops=float(flops) * t.batch,
            params=params,
            order=task_index * 1_000_000 + position,
        )
    return ops


def _same_layers(a: _Op, b: _Op) -> bool:
    """Identical layers: kind, arguments but ``layers``, frozen flag and token counts, and
    no tail (a final norm or pooling head in the last layer) or change of tokens inside."""
    for op in (a, b):
        kind, args = get_kind(op.module.kind), op.module.argmap
        if kind.tail_params(args) or kind.layer_tokens(args, op.tokens) != op.tokens:
            return False
    strip = {"layers"}
    args_a = {k: v for k, v in a.module.args if k not in strip}
    args_b = {k: v for k, v in b.module.args if k not in strip}
    return (
        a.module.kind == b.module.kind
        and args_a == args_b
        and a.module.frozen == b.module.frozen
        and a.tokens == a.out_tokens == b.tokens == b.out_tokens
    )


def _contract(ops: dict[str, _Op], runs: dict[str, list[str]]) -> None:
    """Merge chains a -> b of one task in place (see the module docstring for the rule)."""
    merged = True
    while merged:
        merged = False
        for a in list(ops.values()):
            if len(a.consumers) != 1:
                continue
            b = ops[a.consumers[0]]
            if (
                len(b.inputs) == 1
                and not b.inputs[0].from_modality
                and all(len(runs[name]) == 1 for name, _ in a.segments + b.segments)
                and _same_layers(a, b)
            ):
                _merge(ops, a, b)
                merged = True
                break


def _merge(ops: dict[str, _Op], a: _Op, b: _Op) -> None:
    old_a, old_b = a.id, b.id
    del ops[old_a], ops[old_b]
    a.segments = a.segments + b.segments
    a.consumers = b.consumers
    a.out_tokens = b.out_tokens
    ops[a.id] = a
    for op in ops.values():  # consumers of b now read the merged op
        op.inputs = [
            OpInput(a.id, False, i.tokens) if i.source == old_b and not i.from_modality else i
            for i in op.inputs
        ]
        op.consumers = [a.id if c in (old_a, old_b) else c for c in op.consumers]


def _freeze(ops: dict[str, _Op], dtype_bytes: int) -> tuple[MetaOp, ...]:
    level: dict[str, int] = {}
    backward: dict[str, bool] = {}
    for op in sorted(ops.values(), key=lambda o: o.order):  # dependencies come first
        deps = [i.source for i in op.inputs if not i.from_modality]
        level[op.id] = 1 + max((level[d] for d in deps), default=-1)
        backward[op.id] = not op.module.frozen or any(backward[d] for d in deps)
    built = [
        MetaOp(
            id=op.id,
            task=op.task,
            module="+".join(name for name, _ in op.segments),
            segments=tuple(op.segments),
            kind=op.module.kind,
            args=op.module.args,
            layers=sum(n for _, n in op.segments),
            batch=op.batch,
            tokens=op.tokens,
            out_tokens=op.out_tokens,
            in_width=op.module.in_width,
            out_width=op.module.out_width,
            inputs=tuple(op.inputs),
            level=level[op.id],
            frozen=op.module.frozen,
            needs_backward=backward[op.id],
            forward_flops_per_layer=op.flops,
            params_per_layer=op.params,
            param_bytes_per_layer=op.params * dtype_bytes,
        )
        for op in ops.values()
    ]
    order = {op.id: op.order for op in ops.values()}
    return tuple(sorted(built, key=lambda m: (m.level, order[m.id])))


def _module_infos(checked: Checked, runs: dict[str, list[str]]) -> tuple[ModuleInfo, ...]:
    """The modules some task runs, with parameters counted once however many tasks share."""
    out: list[ModuleInfo] = []
    for m in checked.modules:
        if m.name not in runs:
            continue
        kind = get_kind(m.kind)
        args = m.argmap
        raw: dict[str, int] = {}
        for t in checked.tasks:
            for e in t.edges:
                if e.from_modality and e.target == m.name:
                    raw[e.source] = max(raw.get(e.source, 0), int(e.tokens or 0))
        for t in checked.sizing_tasks:  # a schedule's other phases: the same parameters
            for e in t.edges:
                if e.from_modality and e.target == m.name and e.source in raw:
                    raw[e.source] = max(raw[e.source], int(e.tokens or 0))
        stages = sum(
            int(
                _kind_call(
                    m,
                    "input-stage parameters",
                    kind.input_stage_params,
                    args,
                    replace(info, tokens=raw[info.name]),
                )
            )
            for info in checked.modalities
            if info.name in raw
        )
        head = int(_kind_call(m, "head parameters", kind.head_params, args))
        head += int(_kind_call(m, "tail parameters", kind.tail_params, args))
        layer = int(_kind_call(m, "layer parameters", kind.layer_params, args))
        out.append(
            ModuleInfo(
                name=m.name,
                kind=m.kind,
                args=m.args,
                frozen=m.frozen,
                modality=m.modality,
                tasks=tuple(runs[m.name]),
                params=int(args.get("layers", 1)) * layer + stages + head,
                raw_inputs=tuple(sorted(raw.items())),
                weights=m.weights,
                hf=m.hf,
            )
        )
    return tuple(out)
