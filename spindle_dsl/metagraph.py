"""The MetaGraph: what the planner, the cost model and the runtime see of a spec.

A MetaOp is ``layers`` identical layers of one module run for one task (Spindle's contraction
of a model into coarse operators). MetaOps of different tasks that run the same module share its
parameters; their gradients are summed before the optimizer steps. The planner never sees the
AST: everything it needs is here, resolved to numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

from spindle_dsl.cluster import Cluster

Loss = Literal["lm", "contrastive", "mse"]
ArgValue = int | float | bool | str


@dataclass(frozen=True)
class ModalityInfo:
    """An input modality: ``tokens`` per sample, raw ``features`` per token or a ``vocab``."""

    name: str
    tokens: int
    features: int | None = None
    vocab: int | None = None


@dataclass(frozen=True)
class ModuleInfo:
    """A declared module with its kind arguments resolved (defaults filled in, sorted by name)."""

    name: str
    kind: str
    args: tuple[tuple[str, ArgValue], ...]
    frozen: bool
    modality: str | None  # the modality an `encoder` (or `shared ... <- m`) is bound to
    tasks: tuple[str, ...]  # tasks that run it, in declaration order
    params: int  # parameters of all its layers, input stages and output head
    # Modalities read raw (through an input stage), each with the most tokens per sample any
    # task feeds (``text[2048] -> llm`` beside ``text -> llm``): the input stage's position
    # table is sized for that, so every task's sequence fits.
    raw_inputs: tuple[tuple[str, int], ...] = ()
    weights: str | None = None  # `from "FILE"`: pretrained weights (a resolved path) to load
    # the Hugging Face folder whose config.json the module follows (`hf("DIR")`, or a `from`
    # folder); ``weights`` is that folder when its weights are to be loaded
    hf: str | None = None

    def arg(self, name: str) -> Any:
        return dict(self.args)[name]

    @property
    def layers(self) -> int:
        return int(self.arg("layers"))

    @property
    def shared(self) -> bool:
        return len(self.tasks) > 1


@dataclass(frozen=True)
class OpInput:
    """One incoming edge of a MetaOp, in declaration order (inputs concatenate along tokens)."""

    source: str  # a MetaOp id, or a modality name when ``from_modality``
    from_modality: bool
    tokens: int  # tokens per sample this edge contributes


@dataclass(frozen=True)
class MetaOp:
    """``layers`` identical layers of one module (or a contracted chain of them) for one task."""

    id: str  # "task/module"; a contracted chain is "task/a+b"
    task: str
    module: str  # display name: the module, or "a+b" for a contracted chain
    segments: tuple[tuple[str, int], ...]  # (module, layers) in order; one entry unless contracted
    kind: str
    args: tuple[tuple[str, ArgValue], ...]  # the kind's resolved arguments (of the first segment)
    layers: int  # L_m, the sum over segments
    batch: int  # samples per iteration (the task's batch under the selected mix)
    tokens: int  # input tokens per sample: the sum over incoming edges
    out_tokens: int
    in_width: int
    out_width: int
    inputs: tuple[OpInput, ...]
    level: int  # MetaLevel: length of the longest dependency chain that ends here
    frozen: bool  # takes no parameter gradient
    needs_backward: bool  # runs a backward pass (not frozen, or something before it trains)
    forward_flops_per_layer: float  # one layer's forward FLOPs for the whole batch
    params_per_layer: int
    param_bytes_per_layer: int  # params_per_layer at the training dtype

    @property
    def deps(self) -> tuple[str, ...]:
        """Ids of the MetaOps whose output this one consumes."""
        return tuple(i.source for i in self.inputs if not i.from_modality)

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.segments)

    def arg(self, name: str) -> Any:
        return dict(self.args)[name]


@dataclass(frozen=True)
class TaskInfo:
    """A task: its share of the global batch and the loss that reads its sink MetaOps."""

    name: str
    batch: int
    weight: float | None  # its weight in the selected mix, None without a mix
    loss: Loss
    sinks: tuple[str, ...]  # MetaOp ids whose outputs the loss reads
    data: str | None = None  # `data = "..."`: a resolved path, or "package.module:function"
    eval_data: str | None = None  # `eval_data = "..."`: held-out data, as ``data``


@dataclass(frozen=True)
class SharingGroup:
    """The MetaOps (of different tasks) that run one module and so share its parameters."""

    module: str
    metaops: tuple[str, ...]
    param_bytes: int  # bytes of the module's parameters at the training dtype


@dataclass(frozen=True)
class MetaGraph:
    """The lowered spec. ``metaops`` are in a topological order: by level, then declaration."""

    metaops: tuple[MetaOp, ...]
    tasks: tuple[TaskInfo, ...]
    modules: tuple[ModuleInfo, ...]
    modalities: tuple[ModalityInfo, ...]
    cluster: Cluster
    mix: str | None
    dtype_bytes: int  # bytes per parameter/activation element at the training dtype
    spec_path: str = "<string>"
    spec_sha256: str = ""

    def __iter__(self) -> Iterator[MetaOp]:
        return iter(self.metaops)

    def __len__(self) -> int:
        return len(self.metaops)

    @cached_property
    def _ops(self) -> dict[str, MetaOp]:
        return {m.id: m for m in self.metaops}

    def op(self, metaop_id: str) -> MetaOp:
        return self._ops[metaop_id]

    def find_op(self, metaop_id: str) -> MetaOp | None:
        """The MetaOp, or None where this graph leaves it out (a planner's sub-graph)."""
        return self._ops.get(metaop_id)

    def module(self, name: str) -> ModuleInfo:
        return next(m for m in self.modules if m.name == name)

    def task(self, name: str) -> TaskInfo:
        return next(t for t in self.tasks if t.name == name)

    def modality(self, name: str) -> ModalityInfo:
        return next(m for m in self.modalities if m.name == name)

    def stage_modality(self, module: str, modality: str) -> ModalityInfo:
        """The modality as ``module``'s input stage sees it: tokens = the most any task feeds."""
        tokens = dict(self.module(module).raw_inputs)[modality]
        return replace(self.modality(modality), tokens=tokens)

    @cached_property
    def levels(self) -> tuple[tuple[str, ...], ...]:
        """MetaOp ids per MetaLevel, level 0 first."""
        depth = max((m.level for m in self.metaops), default=-1) + 1
        return tuple(tuple(m.id for m in self.metaops if m.level == lv) for lv in range(depth))

    @cached_property
    def consumers(self) -> dict[str, tuple[str, ...]]:
        """For each MetaOp id, the MetaOps that consume its output."""
        out: dict[str, list[str]] = {m.id: [] for m in self.metaops}
        for m in self.metaops:
            for d in m.deps:
                out[d].append(m.id)
        return {k: tuple(v) for k, v in out.items()}

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, Any]:
        """Jupyter shows the MetaGraph as a picture (``spindle_dsl.render.jupyter``)."""
        from spindle_dsl.render.jupyter import metagraph_mimebundle

        return metagraph_mimebundle(self, include, exclude)

    @cached_property
    def sharing_groups(self) -> tuple[SharingGroup, ...]:
        """Modules run by more than one MetaOp, with the MetaOps that share their parameters."""
        by_module: dict[str, list[str]] = {}
        for m in self.metaops:
            for name in m.modules:
                by_module.setdefault(name, []).append(m.id)
        return tuple(
            SharingGroup(name, tuple(ids), self.module(name).params * self.dtype_bytes)
            for name, ids in by_module.items()
            if len(ids) > 1
        )
