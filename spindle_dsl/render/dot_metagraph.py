"""The MetaGraph as a Graphviz picture: a cluster per task, shared modules visibly shared.

Each MetaOp is a box in its task's cluster, labelled with its module, kind, L, batch x tokens
and forward FLOPs for all its layers; frozen MetaOps have a dashed border and say so. A module
that several tasks run (and whose parameters they therefore share) is marked on every copy: a
double border, a "shared by N MetaOps" line with the parameter size, and a dashed gold chain
linking the copies across the task clusters, so the sharing is seen at once. (Not a separate
node per shared module: its spokes would cross every cluster and hide the data flow.)

It draws a ``MetaGraph`` (everything known) or a ``Plan`` (a plan file carries its MetaOps but
not modalities or frozen flags), through one small view type, so ``spindle render plan.json
--what metagraph`` works without the spec.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from html import escape

import graphviz

from spindle_dsl.metagraph import MetaGraph, MetaOp
from spindle_dsl.plan.model import Plan, PlanMetaOp
from spindle_dsl.render.colors import MODALITY_FILL, Palette, mix, palette, task_order
from spindle_dsl.render.fmt import fmt_bytes, fmt_flops

FONT = "Helvetica"
SHARED_COLOUR = "#8a6d00"  # dark gold: the dashes and text that mark shared parameters


@dataclass(frozen=True)
class OpView:
    """What the picture shows of one MetaOp."""

    id: str
    task: str
    module: str
    kind: str
    layers: int
    batch: int
    tokens: int
    forward_flops: float  # all layers, whole batch
    frozen: bool | None  # None when unknown (drawn from a plan file)
    deps: tuple[str, ...]
    modalities: tuple[tuple[str, int], ...]  # (modality, tokens per sample) edges


@dataclass(frozen=True)
class SharedView:
    module: str
    metaops: tuple[str, ...]
    param_bytes: int | None


@dataclass(frozen=True)
class GraphView:
    title: str
    ops: tuple[OpView, ...]
    tasks: tuple[tuple[str, str], ...]  # (task, caption) in colour order
    shared: tuple[SharedView, ...]


def _op_view(
    m: MetaOp | PlanMetaOp, frozen: bool | None, modalities: tuple[tuple[str, int], ...]
) -> OpView:
    """The fields a MetaGraph's MetaOp and a plan file's MetaOp share, plus what only one has."""
    flops = m.forward_flops_per_layer * m.layers
    return OpView(
        m.id,
        m.task,
        m.module,
        m.kind,
        m.layers,
        m.batch,
        m.tokens,
        flops,
        frozen,
        m.deps,
        modalities,
    )


def graph_view(source: MetaGraph | Plan) -> GraphView:
    """The drawable facts of a MetaGraph, or of the MetaOps a plan file records."""
    if isinstance(source, MetaGraph):
        ops = tuple(
            _op_view(m, m.frozen, tuple((i.source, i.tokens) for i in m.inputs if i.from_modality))
            for m in source.metaops
        )
        order = task_order((m.task for m in source.metaops), (t.name for t in source.tasks))
        infos = {t.name: t for t in source.tasks}
        tasks = tuple(
            (name, f"batch {infos[name].batch} · loss {infos[name].loss}")
            if name in infos
            else (name, "")
            for name in order
        )
        shared = tuple(
            SharedView(g.module, g.metaops, g.param_bytes) for g in source.sharing_groups
        )
        c = source.cluster
        title = f"{source.spec_path} · mix {source.mix or '-'} · {c.devices} × {c.device.name}"
        return GraphView(title, ops, tasks, shared)
    ops = tuple(_op_view(m, None, ()) for m in source.metaops)
    order = task_order(m.task for m in source.metaops)
    by_module: dict[str, list[str]] = {}
    for m in source.metaops:
        for name in m.module.split("+"):
            by_module.setdefault(name, []).append(m.id)
    shared = tuple(
        SharedView(name, tuple(ids), None) for name, ids in by_module.items() if len(ids) > 1
    )
    c = source.cluster
    title = f"{source.spec.path} · mix {source.spec.mix or '-'} · {c.devices} × {c.device}"
    return GraphView(title, ops, tuple((t, "") for t in order), shared)


def _op_label(op: OpView, shared: SharedView | None) -> str:
    rows = [
        f"<b>{escape(op.module)}</b>",
        f"{escape(op.kind)} · L={op.layers}",
        f"{op.batch} × {op.tokens} tok",
        f"fwd {fmt_flops(op.forward_flops)}",
    ]
    if op.frozen:
        rows.append("<i>frozen</i>")
    if shared is not None:
        size = f" · {fmt_bytes(shared.param_bytes)}" if shared.param_bytes is not None else ""
        rows.append(
            f'<font color="{SHARED_COLOUR}">shared by {len(shared.metaops)} MetaOps{size}</font>'
        )
    return "<" + "<br/>".join(rows) + ">"


def metagraph_dot(source: MetaGraph | Plan, colours: Palette | None = None) -> graphviz.Digraph:
    """The picture's DOT graph. ``colours`` defaults to the task order of ``source``."""
    view = graph_view(source)
    colours = colours or palette([t for t, _ in view.tasks])
    dot = graphviz.Digraph("metagraph")
    dot.attr(
        rankdir="LR",
        newrank="true",
        fontname=FONT,
        label=escape(view.title),
        labelloc="t",
        fontsize="16",
    )
    dot.attr("node", fontname=FONT, fontsize="11")
    dot.attr("edge", fontname=FONT, fontsize="9", color="#555555")
    shared_of = {i: s for s in view.shared for i in s.metaops}
    modalities = sorted({name for op in view.ops for name, _ in op.modalities})
    for name in modalities:
        dot.node(
            f"modality__{name}",
            f"<<i>{escape(name)}</i>>",
            shape="parallelogram",
            style="filled",
            fillcolor=MODALITY_FILL,
        )
    for task, caption in view.tasks:
        col = colours[task]
        with dot.subgraph(name=f"cluster_task_{task}") as sub:
            head = f"<b>task {escape(task)}</b>" + (f"<br/>{escape(caption)}" if caption else "")
            sub.attr(
                label=f"<{head}>",
                color=col.base,
                style="rounded,filled",
                fillcolor=mix(col.base, "#ffffff", 0.9),
                penwidth="2",
            )
            for op in view.ops:
                if op.task != task:
                    continue
                style = "rounded,filled" + (",dashed" if op.frozen else "")
                sub.node(
                    op.id,
                    _op_label(op, shared_of.get(op.id)),
                    shape="box",
                    style=style,
                    fillcolor=col.light,
                    color=col.base,
                    penwidth="2",
                    peripheries="2" if op.id in shared_of else "1",
                    tooltip=op.id,
                )
    for op in view.ops:
        for name, tokens in op.modalities:
            dot.edge(f"modality__{name}", op.id, label=f"{tokens} tok")
        for dep in op.deps:
            dot.edge(dep, op.id)
    for s in view.shared:  # a dashed chain through the copies of each shared module
        for a, b in itertools.pairwise(s.metaops):
            dot.edge(
                a,
                b,
                style="dashed",
                dir="none",
                color=SHARED_COLOUR,
                penwidth="1.5",
                constraint="false",
                tooltip=f"{s.module}: parameters shared",
            )
    return dot
