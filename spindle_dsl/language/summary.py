"""What ``spindle check`` prints: rows of plain dicts, then a text table or JSON.

The rows are built once and rendered twice (human table, ``--json``), so both always show the
same figures. Columns are declared as data (key, header, format): a later stage that wants to
show more per MetaOp (its time curve, say) adds keys to the rows and entries to the column
list, without touching the renderer.

FLOP figures per iteration: forward is ``forward_flops_per_layer * layers``; training adds a
backward pass of about twice the forward (input and weight gradients) for a MetaOp that
trains, about once the forward (input gradients only) for a frozen MetaOp that must still pass
gradients back, and nothing for one that needs no backward: the usual 1:2 rule of thumb.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from spindle_dsl.metagraph import MetaGraph, MetaOp
from spindle_dsl.phases import MixSchedule
from spindle_dsl.recipe import TrainSettings

Row = dict[str, Any]
Column = tuple[str, str, Callable[[Any], str]]  # (key, header, format)


def _plain(x: Any) -> str:
    return "-" if x is None else str(x)


def _gflop(x: float) -> str:
    return f"{x:,.1f}" if x >= 10 else f"{x:.3g}"


def _count(x: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}"
    return str(x)


TASK_COLUMNS: list[Column] = [
    ("name", "task", _plain),
    ("batch", "batch", _plain),
    ("weight", "weight", lambda w: "-" if w is None else f"{w:g}"),
    ("loss", "loss", _plain),
    ("sinks", "sinks", lambda s: ", ".join(s)),
]
MODULE_COLUMNS: list[Column] = [
    ("name", "module", _plain),
    ("kind", "kind", _plain),
    ("layers", "L", _plain),
    ("params", "params", _count),
    ("frozen", "frozen", lambda f: "yes" if f else ""),
    ("tasks", "tasks", lambda t: ", ".join(t)),
]
METAOP_COLUMNS: list[Column] = [
    ("id", "MetaOp", _plain),
    ("level", "lvl", _plain),
    ("layers", "L", _plain),
    ("batch", "batch", _plain),
    ("tokens", "tokens", _plain),
    ("out_tokens", "out", _plain),
    ("fwd_gflop", "fwd GFLOP/it", _gflop),
    ("train_gflop", "train GFLOP/it", _gflop),
    ("backward", "bwd", lambda b: "yes" if b else "no"),
]


def backward_factor(op: MetaOp) -> int:
    """Forward-pass multiples a training step spends on ``op`` (see the module docstring)."""
    if not op.needs_backward:
        return 1
    return 2 if op.frozen else 3


def task_rows(graph: MetaGraph) -> list[Row]:
    return [
        {"name": t.name, "batch": t.batch, "weight": t.weight, "loss": t.loss, "sinks": t.sinks}
        for t in graph.tasks
    ]


def module_rows(graph: MetaGraph) -> list[Row]:
    return [
        {
            "name": m.name,
            "kind": m.kind,
            "layers": m.layers,
            "params": m.params,
            "frozen": m.frozen,
            "modality": m.modality,
            "tasks": m.tasks,
            "args": dict(m.args),
            "hf": m.hf,  # the Hugging Face folder whose config.json gave the arguments
        }
        for m in graph.modules
    ]


def metaop_rows(graph: MetaGraph) -> list[Row]:
    rows = []
    for op in graph.metaops:
        fwd = op.forward_flops_per_layer * op.layers / 1e9
        rows.append(
            {
                "id": op.id,
                "task": op.task,
                "module": op.module,
                "kind": op.kind,
                "level": op.level,
                "layers": op.layers,
                "segments": [list(s) for s in op.segments],
                "batch": op.batch,
                "tokens": op.tokens,
                "out_tokens": op.out_tokens,
                "deps": list(op.deps),
                "fwd_gflop": fwd,
                "train_gflop": fwd * backward_factor(op),
                "params_per_layer": op.params_per_layer,
                "frozen": op.frozen,
                "backward": op.needs_backward,
            }
        )
    return rows


def phase_rows(schedule: MixSchedule) -> list[Row]:
    """A row per phase of a schedule: its steps (0-based, ``last`` None for open-ended), mix,
    global batch and each task's batch."""
    rows = []
    for i, p in enumerate(schedule.phases):
        last = schedule.phases[i + 1].first_step - 1 if i + 1 < len(schedule) else None
        batches = {t: p.batch(t) for t in schedule.task_names}
        rows.append(
            {
                "phase": i + 1,
                "first_step": p.first_step,
                "last_step": last,
                "steps": f"{p.first_step}-{'' if last is None else last}",
                "mix": p.mix,
                "global_batch": sum(batches.values()),
                "batches": batches,
            }
        )
    return rows


def train_flops(graph: MetaGraph) -> float:
    """FLOPs of one training iteration of ``graph``: every MetaOp's forward times its
    ``backward_factor`` (what ``spindle check`` calls GFLOP per iteration)."""
    return sum(op.forward_flops_per_layer * op.layers * backward_factor(op) for op in graph)


def train_rows(settings: TrainSettings) -> dict[str, Any]:
    """The run's resolved recipe, JSON-ready, keyed as the train block is (``lr_scales`` as
    module -> factor)."""
    out: dict[str, Any] = dataclasses.asdict(settings)
    out["lr_scales"] = dict(settings.lr_scales)
    return out


def _train_pairs(train: dict[str, Any]) -> list[str]:
    """The recipe as ``key = value`` pieces, written as a train block would write them."""
    out = []
    for key, value in train.items():
        if key == "lr_scales":
            out += [f"lr_scale {m} = {v:g}" for m, v in value.items()]
        elif key == "clip_grad" and not value:
            out.append("clip_grad = off")
        elif isinstance(value, str):
            out.append(f'{key} = "{value}"')
        else:
            out.append(f"{key} = {value:g}" if isinstance(value, float) else f"{key} = {value}")
    return out


def summarize(
    graph: MetaGraph,
    warnings: list[str] | None = None,
    schedule: MixSchedule | None = None,
    train: TrainSettings | None = None,
) -> dict[str, Any]:
    """Everything ``spindle check`` shows, as JSON-ready data (``schedule``: the phases, when
    the spec has a schedule; ``graph`` is then its first phase's; ``train``: the run's
    resolved recipe)."""
    c = graph.cluster
    ops = metaop_rows(graph)
    return {
        "spec": graph.spec_path,
        "sha256": graph.spec_sha256,
        "mix": graph.mix,
        "cluster": {
            "devices": c.devices,
            "devices_per_node": c.devices_per_node,
            "device": c.device.name,
            "peak_tflops": c.device.peak_flops / 1e12,
            "memory_bytes": c.device.memory_bytes,
        },
        "dtype_bytes": graph.dtype_bytes,
        "levels": len(graph.levels),
        "tasks": task_rows(graph),
        "modules": module_rows(graph),
        "metaops": ops,
        "totals": {
            "params": sum(m.params for m in graph.modules),
            "fwd_gflop": sum(r["fwd_gflop"] for r in ops),
            "train_gflop": sum(r["train_gflop"] for r in ops),
        },
        "warnings": warnings or [],
        **({"schedule": phase_rows(schedule)} if schedule is not None else {}),
        **({"train": train_rows(train)} if train else {}),
    }


def _train_lines(pairs: list[str], width: int = 100) -> list[str]:
    """``  train: steps = 40, lr = 0.0003, ...`` wrapped under its first setting."""
    lines, current = [], "  train: "
    for i, pair in enumerate(pairs):
        piece = pair + ("," if i + 1 < len(pairs) else "")
        if len(current) + len(piece) > width and current.strip() != "train:":
            lines.append(current.rstrip())
            current = " " * len("  train: ")
        current += piece + " "
    return [*lines, current.rstrip()]


def _arg_text(value: Any) -> str:
    """A kind argument as a spec writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _hf_lines(modules: list[Row], width: int = 100) -> list[str]:
    """``  lm: hf("DIR") = transformer(layers = 24, ...)`` for each module whose arguments
    came from a Hugging Face config, wrapped under its first argument."""
    lines = []
    for m in modules:
        if not m.get("hf"):
            continue
        pairs = [f"{k} = {_arg_text(v)}" for k, v in m["args"].items()]
        start = f'  {m["name"]}: hf("{m["hf"]}") = {m["kind"]}('
        current = start
        for i, pair in enumerate(pairs):
            piece = pair + (", " if i + 1 < len(pairs) else ")")
            if len(current) + len(piece) > width and current != start:
                lines.append(current.rstrip())
                current = " " * 4
            current += piece
        lines.append(current)
    return lines


def render_table(rows: list[Row], columns: list[Column]) -> str:
    """Left-aligned text columns, numbers right-aligned, one header line."""
    cells = [[fmt(row.get(key)) for key, _, fmt in columns] for row in rows]
    headers = [h for _, h, _ in columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(_looks_numeric(r[i]) for r in cells) and cells for i in range(len(headers))]

    def line(values: list[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])


def _looks_numeric(text: str) -> bool:
    return text.replace(",", "").replace(".", "").rstrip("KMB").lstrip("-").isdigit()


def render_summary(data: dict[str, Any]) -> str:
    """The human form of ``summarize``'s data."""
    c = data["cluster"]
    t = data["totals"]
    mix = f"mix '{data['mix']}'" if data["mix"] else "no mix (batches from the tasks)"
    head = [
        f"{data['spec']}: ok",
        f"  cluster: {c['devices']} x {c['device']} ({c['devices_per_node']} per node), "
        f"{data['dtype_bytes']}-byte training dtype",
        f"  {len(data['tasks'])} tasks under {mix}; {len(data['modules'])} modules, "
        f"{_count(t['params'])} parameters; {len(data['metaops'])} MetaOps in "
        f"{data['levels']} levels; {_gflop(t['train_gflop'])} GFLOP per iteration "
        f"({_gflop(t['fwd_gflop'])} forward)",
    ]
    if data.get("train"):
        head += _train_lines(_train_pairs(data["train"]))
    head += _hf_lines(data["modules"])
    phases = []
    if data.get("schedule"):
        names = list(data["schedule"][0]["batches"])
        head.append(
            f"  schedule: {len(data['schedule'])} phases (steps counted from 0, as in the "
            f"schedule block); the tables below are the first phase's"
        )
        rows = [{**r, **{f"batch:{t}": r["batches"][t] for t in names}} for r in data["schedule"]]
        columns: list[Column] = [
            ("phase", "phase", _plain),
            ("steps", "steps", _plain),
            ("mix", "mix", _plain),
            ("global_batch", "batch", _plain),
            *((f"batch:{t}", t, _plain) for t in names),
        ]
        phases.append(render_table(rows, columns))
    return "\n\n".join(
        [
            "\n".join(head),
            *phases,
            render_table(data["tasks"], TASK_COLUMNS),
            render_table(data["modules"], MODULE_COLUMNS),
            render_table(data["metaops"], METAOP_COLUMNS),
        ]
    )
