"""What the checker hands to the lowering: the spec with every name and value resolved.

These values exist only when the spec checked clean, so the lowering can trust them: kinds
exist and accepted their arguments, edges join known nodes with matching widths, every task's
graph is acyclic and has a batch and a loss. Source locations stay attached (not compared) so
that a later stage can still point at the line a number came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spindle_dsl.cluster import Cluster
from spindle_dsl.errors import Diagnostic
from spindle_dsl.language.ast import NOWHERE, Loc, Spec
from spindle_dsl.metagraph import ArgValue, Loss, ModalityInfo
from spindle_dsl.recipe import DEFAULTS, TrainSettings


@dataclass(frozen=True)
class ResolvedModule:
    """A module declaration whose kind accepted its arguments (defaults filled in)."""

    name: str
    keyword: str  # encoder, module or shared, as declared
    kind: str
    args: tuple[tuple[str, ArgValue], ...]  # resolved, sorted by name
    frozen: bool
    modality: str | None  # the modality it is bound to with `<-`
    in_width: int
    out_width: int
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)
    weights: str | None = None  # `from "FILE"`: the file, resolved against the spec's folder
    hf: str | None = None  # the Hugging Face folder whose config.json it follows (hf(...))

    @property
    def argmap(self) -> dict[str, Any]:
        return dict(self.args)


@dataclass(frozen=True)
class Edge:
    """One edge of a task's graph; a modality edge carries the tokens it feeds per sample."""

    source: str
    target: str
    from_modality: bool
    tokens: int | None = None  # modality edges only: the modality's tokens or the task's count
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)


@dataclass(frozen=True)
class ResolvedTask:
    """A task with its acyclic graph, its sinks, its loss and its batch."""

    name: str
    modules: tuple[str, ...]  # in order of first appearance in the task's paths
    edges: tuple[Edge, ...]  # distinct edges in declaration order
    sinks: tuple[str, ...]  # modules no edge leaves, in order of appearance
    loss: Loss
    batch: int
    weight: float | None  # its weight in the selected mix, None without one
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)
    data: str | None = None  # `data = "..."`: a resolved path, or "package.module:function"
    eval_data: str | None = None  # `eval_data = "..."`: held-out data, as ``data``


@dataclass(frozen=True)
class ResolvedPhase:
    """A phase of the spec's schedule: from ``first_step`` completed optimizer steps on, the
    tasks get the batches of ``mix`` (``tasks``: those with samples in it)."""

    first_step: int
    mix: str
    tasks: tuple[ResolvedTask, ...]


@dataclass(frozen=True)
class Checked:
    """A spec that passed every check: the input of ``lower``."""

    spec: Spec
    cluster: Cluster
    modalities: tuple[ModalityInfo, ...]  # declaration order
    modules: tuple[ResolvedModule, ...]  # declaration order
    tasks: tuple[ResolvedTask, ...]  # tasks that get samples, declaration order
    mix: str | None
    warnings: tuple[Diagnostic, ...] = ()
    # The schedule the run follows (empty without one, or when a mix was chosen by name).
    phases: tuple[ResolvedPhase, ...] = ()
    # Tasks whose inputs size the modules' input stages, when that is not ``tasks``: with a
    # schedule, every task of every phase, so each phase's model has the same parameters.
    sizing_tasks: tuple[ResolvedTask, ...] = ()
    # The run's recipe: the train block and the modules' lr_scale, with the overrides.
    train: TrainSettings = DEFAULTS

    def module(self, name: str) -> ResolvedModule:
        return next(m for m in self.modules if m.name == name)

    def modality(self, name: str) -> ModalityInfo:
        return next(m for m in self.modalities if m.name == name)
