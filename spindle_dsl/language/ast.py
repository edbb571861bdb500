"""The syntax tree of a ``.spindle`` file: frozen dataclasses that remember where they came from.

Every node carries a ``Loc`` so the checker can point at the exact token a user must fix. The
location is excluded from equality (``compare=False``) on purpose: ``spindle fmt`` moves text
around, and "formatting does not change meaning" is then simply ``parse(fmt(s)) == parse(s)``.
Statements keep their source order (the formatter never reorders), so equality is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from spindle_dsl.errors import SourceSpan

ValueKind = Literal["int", "float", "bool", "string", "name", "size"]
ModuleKeyword = Literal["encoder", "module", "shared"]


@dataclass(frozen=True)
class Loc:
    """A source range: 1-based lines and columns, ``end_column`` exclusive."""

    line: int
    column: int
    end_line: int
    end_column: int

    def span(self, path: str) -> SourceSpan:
        """The diagnostic span; a range that wraps lines underlines only its first token."""
        end = self.end_column if self.end_line == self.line else None
        return SourceSpan(path, self.line, self.column, end)

    def head(self, width: int) -> Loc:
        """The first ``width`` characters (a declaration's keyword, say)."""
        return Loc(self.line, self.column, self.line, self.column + width)

    def to(self, other: Loc) -> Loc:
        """The range from the start of ``self`` to the end of ``other``."""
        return Loc(self.line, self.column, other.end_line, other.end_column)


NOWHERE = Loc(0, 0, 0, 0)


@dataclass(frozen=True)
class Ident:
    """A name as written: a declaration's name or a reference to one."""

    name: str
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)


@dataclass(frozen=True)
class Value:
    """A literal on the right of ``=``. ``name`` values are bare words (``loss = lm``); a
    ``size`` is a number with a unit (``80GB``, ``25GB/s``), converted by ``units``."""

    kind: ValueKind
    value: int | float | bool | str
    unit: str | None = None
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)

    def describe(self) -> str:
        """The value as a user would write it, for messages."""
        if self.kind == "string":
            return f'"{self.value}"'
        if self.kind == "bool":
            return "true" if self.value else "false"
        if self.kind == "size":
            return f"{self.value}{self.unit}"
        return str(self.value)


@dataclass(frozen=True)
class Setting:
    """``key = value``: a cluster or modality field, a kind argument, a task or mix entry."""

    key: Ident
    value: Value
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)


@dataclass(frozen=True)
class Path:
    """``a -> b -> c``; the first step may carry a per-task token count: ``text[256] -> llm``."""

    steps: tuple[Ident, ...]
    first_tokens: Value | None = None
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)

    def edges(self) -> list[tuple[Ident, Ident]]:
        """Consecutive pairs: the edges this path adds to its task's graph."""
        return list(zip(self.steps, self.steps[1:], strict=False))


@dataclass(frozen=True)
class ClusterDecl:
    settings: tuple[Setting, ...]
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)


@dataclass(frozen=True)
class ModalityDecl:
    name: Ident
    settings: tuple[Setting, ...]
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)


@dataclass(frozen=True)
class ModuleDecl:
    """``encoder|module|shared NAME : KIND(args) [<- MODALITY] [frozen] [from "FILE"]
    [OPTION = VALUE ...]``: options are the module's training settings (``lr_scale``)."""

    keyword: ModuleKeyword
    name: Ident
    kind: Ident
    args: tuple[Setting, ...]
    modality: Ident | None = None
    frozen: bool = False
    weights: Value | None = None  # the string after ``from``: pretrained weights to load
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)
    options: tuple[Setting, ...] = ()  # ``lr_scale = 0.1`` after the declaration
    source: Value | None = None  # a kind's positional string: the folder of ``hf("DIR")``


@dataclass(frozen=True)
class TaskDecl:
    """A task block: paths and settings (``batch``, ``loss``) in source order."""

    name: Ident
    body: tuple[Path | Setting, ...]
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(s for s in self.body if isinstance(s, Path))

    @property
    def settings(self) -> tuple[Setting, ...]:
        return tuple(s for s in self.body if isinstance(s, Setting))


@dataclass(frozen=True)
class MixDecl:
    """``mix NAME { global_batch = N; TASK = WEIGHT ... }``."""

    name: Ident
    settings: tuple[Setting, ...]
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)


@dataclass(frozen=True)
class ScheduleEntry:
    """``STEP: MIX``: ``mix`` applies once ``step`` optimizer steps have completed."""

    step: Value
    mix: Ident
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)


@dataclass(frozen=True)
class ScheduleDecl:
    """``schedule { 0: warmup; 3: main }``: the mixes a run follows, in source order."""

    entries: tuple[ScheduleEntry, ...]
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)


@dataclass(frozen=True)
class TrainDecl:
    """``train { steps = 100; lr = 3e-4 ... }``: the run's training recipe."""

    settings: tuple[Setting, ...]
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)


Decl = ClusterDecl | ModalityDecl | ModuleDecl | TaskDecl | MixDecl | ScheduleDecl | TrainDecl


@dataclass(frozen=True)
class Comment:
    """A ``#`` comment, kept only so that ``spindle fmt`` can put it back."""

    text: str
    line: int
    column: int


@dataclass(frozen=True)
class Spec:
    """A parsed file: its declarations in source order, plus the text it came from."""

    decls: tuple[Decl, ...]
    path: str = field(default="<string>", compare=False)
    source: str = field(default="", compare=False, repr=False)
    comments: tuple[Comment, ...] = field(default=(), compare=False, repr=False)

    def of_type(self, cls: type) -> list:
        return [d for d in self.decls if isinstance(d, cls)]

    @property
    def clusters(self) -> list[ClusterDecl]:
        return self.of_type(ClusterDecl)

    @property
    def modalities(self) -> list[ModalityDecl]:
        return self.of_type(ModalityDecl)

    @property
    def modules(self) -> list[ModuleDecl]:
        return self.of_type(ModuleDecl)

    @property
    def tasks(self) -> list[TaskDecl]:
        return self.of_type(TaskDecl)

    @property
    def mixes(self) -> list[MixDecl]:
        return self.of_type(MixDecl)

    @property
    def schedules(self) -> list[ScheduleDecl]:
        return self.of_type(ScheduleDecl)

    @property
    def trains(self) -> list[TrainDecl]:
        return self.of_type(TrainDecl)
