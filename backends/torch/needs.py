"""What each task reads of its raw data: per modality, the tokens and the width of each token;
per sink of an ``mse`` task, the target's shape. The synthetic source, the on-disk format and
the check of a bound dataset all start from these, so they agree on what a sample is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from spindle_dsl.errors import ExecutionError
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph

Form = Literal["vocab", "features", "image"]


@dataclass(frozen=True)
class InputNeed:
    """What one task reads of one raw modality: tokens per sample and the width of each."""

    task: str
    modality: str
    form: Form
    tokens: int  # the most any edge of the task reads (edges take a prefix)
    width: int  # features or pixels per token; the vocabulary size for token ids


@dataclass(frozen=True)
class TargetNeed:
    """The regression target of one sink of an ``mse`` task."""

    task: str
    sink: str
    shape: tuple[int, int]  # (tokens, width) of the sink's output


def _raw_width(graph: MetaGraph, module: str, modality: str) -> tuple[Form, int]:
    m = graph.modality(modality)
    if m.vocab is not None:
        return "vocab", m.vocab
    if m.features is not None:
        return "features", m.features
    info = graph.module(module)
    kind, args = get_kind(info.kind), dict(info.args)
    if hasattr(kind, "patch_features"):
        return "image", int(kind.patch_features(args))
    if "patch" in args:
        return "image", 3 * int(args["patch"]) ** 2
    raise ExecutionError(
        f"module {module} ({info.kind}) reads image modality {modality} but says no patch size"
    )


def input_needs(graph: MetaGraph) -> dict[str, dict[str, InputNeed]]:
    """Per task, per modality: what its MetaOps read."""
    out: dict[str, dict[str, InputNeed]] = {}
    for op in graph.metaops:
        if op.batch <= 0:
            continue
        for inp in op.inputs:
            if not inp.from_modality:
                continue
            form, width = _raw_width(graph, op.segments[0][0], inp.source)
            have = out.setdefault(op.task, {}).get(inp.source)
            if have is not None and (have.form, have.width) != (form, width):
                raise ExecutionError(
                    f"task {op.task} reads {inp.source} with {have.width} and {width} values per "
                    f"token (two encoders with different patch sizes); use one patch size"
                )
            tokens = max(inp.tokens, have.tokens if have else 0)
            out[op.task][inp.source] = InputNeed(op.task, inp.source, form, tokens, width)
    return out


def target_needs(graph: MetaGraph) -> dict[str, tuple[TargetNeed, ...]]:
    return {
        t.name: tuple(
            TargetNeed(t.name, s, (graph.op(s).out_tokens, graph.op(s).out_width)) for s in t.sinks
        )
        for t in graph.tasks
        if t.loss == "mse" and t.batch > 0
    }
