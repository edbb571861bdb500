"""What a graph's training step consists of, beyond its layers: read off the MetaGraph once.

For every MetaOp, its parameter parts layer by layer (with their gradient bytes, 0 when
frozen), its input stages (run on its first entry) and the share of a layer's time its
backward pass takes; for every sink, its loss head. Parts are named as the runtime names them
(``module/layer.J``, ``module/input.MODALITY``, ``module/head``), and input stages and loss heads
carry the keys their measured costs are filed under in a profile (``input_key``,
``loss_key``). ``cost.step`` prices a step from these.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from spindle_dsl.cost.analytic import backward_share
from spindle_dsl.cost.tied import tied_embedding_modality
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph, MetaOp


def input_key(module: str, modality: str, tokens: int, mode: str) -> str:
    """Names an input stage's cost: the part, the tokens it reads, and its passes."""
    return f"{module}/input.{modality}@{tokens}:{mode}"


def loss_key(task_loss: str, sink: MetaOp, text_tokens: int) -> str:
    """Names a loss head's cost: the loss, the sink's shape and, for lm, its text tokens."""
    shape = f"{sink.kind}:{sink.out_tokens}x{sink.out_width}"
    if task_loss == "lm":
        vocab = dict(sink.args).get("vocab")
        return f"lm:{shape}:vocab{vocab}:text{text_tokens}:{_mode(sink)}"
    return f"{task_loss}:{shape}:{_mode(sink)}"


def _mode(op: MetaOp) -> str:
    return "forward" if not op.needs_backward else ("input_grad" if op.frozen else "train")


@dataclass(frozen=True)
class InputStage:
    """One input stage a MetaOp's first layer reads from (runs on its first entry)."""

    key: str
    part: str  # the runtime's part key, "module/input.MODALITY"
    grad_bytes: float  # bytes of its gradient (0 when frozen)
    flops_per_sample: float  # forward+backward, for the analytic fallback


@dataclass(frozen=True)
class SinkLoss:
    """One sink's loss head: where it runs and what it costs."""

    task: str
    sink: str  # MetaOp id
    loss: str  # "lm", "mse" or "contrastive"
    key: str
    flops_per_sample: float  # forward+backward, for the analytic fallback
    head_part: str | None  # "module/head" for lm
    head_bytes: float  # its gradient bytes (0 when frozen or no head)
    tied_part: str | None = None  # the embedding stage a tied head multiplies by
    tied_bytes: float = 0.0  # its gradient bytes
    # lm: the positions the head reads per sample (text tokens - 1) and their bytes, which
    # move when the loss is spread over more devices (``planner.evaluate.relabel``)
    hidden_bytes: float = 0.0
    positions: int = 0


@dataclass(frozen=True)
class OpStep:
    """What the step model needs of one MetaOp."""

    id: str
    batch: int
    layers: int
    layer_parts: tuple[tuple[str, float], ...]  # per global layer: (part key, gradient bytes)
    inputs: tuple[InputStage, ...]
    backward_share: float  # backward's share of a layer's forward+backward time


def _input_flops(graph: MetaGraph, op: MetaOp, modality: str, tokens: int) -> float:
    """Forward FLOPs per sample of an input stage: the kind's count where it gives one, else
    as the built-in kinds build them: a gather and a position add for token ids, a linear
    layer for features or pixel patches."""
    first = graph.module(op.segments[0][0])
    kind = get_kind(first.kind)
    info = graph.stage_modality(first.name, modality)
    own = kind.input_stage_flops(dict(first.args), replace(info, tokens=tokens))
    if own is not None:
        return float(own)
    width = kind.in_width(dict(first.args))
    if info.vocab is not None:
        return 8.0 * tokens * width
    params = kind.input_stage_params(dict(first.args), info)
    return 2.0 * tokens * max(params - info.tokens * width, width)


def op_steps(graph: MetaGraph) -> dict[str, OpStep]:
    """The parts, input stages and backward share of every MetaOp."""
    dt = float(graph.dtype_bytes)
    out: dict[str, OpStep] = {}
    for op in graph.metaops:
        layers: list[tuple[str, float]] = []
        for module, count in op.segments:
            known = [m for m in graph.modules if m.name == module]  # hand-made graphs lack them
            frozen = known[0].frozen if known else op.frozen
            per = 0.0 if frozen else op.params_per_layer * dt
            layers.extend((f"{module}/layer.{j}", per) for j in range(count))
            if known and not frozen:  # the last layer holds the module's tail too
                kind = get_kind(known[0].kind)
                tail = kind.tail_params(dict(known[0].args)) * dt
                layers[-1] = (layers[-1][0], per + tail)
        inputs = []
        for inp in op.inputs:
            if not inp.from_modality:
                continue
            first = graph.module(op.segments[0][0])
            kind = get_kind(first.kind)
            params = kind.input_stage_params(
                dict(first.args), graph.stage_modality(first.name, inp.source)
            )
            mode = "train" if not first.frozen else "forward"
            inputs.append(
                InputStage(
                    input_key(first.name, inp.source, inp.tokens, mode),
                    f"{first.name}/input.{inp.source}",
                    0.0 if first.frozen else params * dt,
                    (1.0 if first.frozen else 3.0)
                    * _input_flops(graph, op, inp.source, inp.tokens),
                )
            )
        out[op.id] = OpStep(
            op.id, op.batch, op.layers, tuple(layers), tuple(inputs), backward_share(op)
        )
    return out


def _text_tokens(graph: MetaGraph, op: MetaOp) -> int:
    for inp in op.inputs:
        if inp.from_modality and graph.modality(inp.source).vocab is not None:
            return inp.tokens
    return 0


def sink_losses(graph: MetaGraph) -> tuple[SinkLoss, ...]:
    """Every sink's loss head, in task order."""
    dt = float(graph.dtype_bytes)
    out = []
    for task in graph.tasks:
        if task.batch <= 0:
            continue
        for sink_id in task.sinks:
            sink = graph.op(sink_id)
            passes = 3.0 if sink.needs_backward else 1.0
            head_part, head_bytes, flops = None, 0.0, 0.0
            tied_part, tied_bytes = None, 0.0
            text = 0
            hidden = 0.0
            if task.loss == "lm":
                text = _text_tokens(graph, sink)
                last = graph.module(sink.segments[-1][0])
                kind = get_kind(last.kind)
                vocab = int(dict(last.args).get("vocab") or 0)
                flops = passes * 2.0 * max(text - 1, 0) * sink.out_width * vocab
                hidden = max(text - 1, 0) * sink.out_width * dt
                head_part = f"{last.name}/head"
                if not last.frozen:
                    head_bytes = kind.head_params(dict(last.args)) * dt
                modality = tied_embedding_modality(graph, last.name)
                if modality is not None:
                    tied_part = f"{last.name}/input.{modality}"
                    if not last.frozen:
                        stage = graph.stage_modality(last.name, modality)
                        tied_bytes = kind.input_stage_params(dict(last.args), stage) * dt
            else:
                flops = passes * 4.0 * sink.out_tokens * sink.out_width
            out.append(
                SinkLoss(
                    task.name,
                    sink_id,
                    task.loss,
                    loss_key(task.loss, sink, text),
                    flops,
                    head_part,
                    head_bytes,
                    tied_part,
                    tied_bytes,
                    hidden,
                    max(text - 1, 0),
                )
            )
    return tuple(out)
