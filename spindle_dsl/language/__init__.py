"""The ``.spindle`` language front end: parse, check, lower, format.

``compile_file``/``compile_text`` run the whole front end and return a ``Compiled`` (the AST,
the MetaGraph, the warnings, and for a spec with a ``schedule`` a MetaGraph per phase). The
stages are public too, each a function from one frozen value to the next: ``parse`` (text to
``Spec``), ``check`` (``Spec`` to ``Checked``), ``lower`` (``Checked`` to ``MetaGraph``) and
``format_spec`` (``Spec`` back to canonical text). Every problem a spec can have is raised as
``SpecError`` carrying all the diagnostics found.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spindle_dsl.errors import Diagnostic, SourceSpan, SpecError
from spindle_dsl.language.ast import Spec
from spindle_dsl.language.checker import check
from spindle_dsl.language.fmt import format_spec
from spindle_dsl.language.lower import lower
from spindle_dsl.language.parser import parse
from spindle_dsl.language.resolved import Checked
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.phases import MixSchedule, Phase
from spindle_dsl.recipe import DEFAULTS, TrainSettings

__all__ = [
    "Checked",
    "Compiled",
    "Spec",
    "check",
    "compile_file",
    "compile_text",
    "decode_spec",
    "format_spec",
    "lower",
    "parse",
    "read_spec_text",
]


@dataclass(frozen=True)
class Compiled:
    """A spec that compiled: its AST, its MetaGraph and the warnings it drew. ``schedule``:
    the phases the run follows when the spec has a schedule (and no mix was named); its first
    phase's graph is ``graph``. ``train``: the run's recipe (the train block, the modules'
    ``lr_scale`` and the overrides, over the defaults)."""

    spec: Spec
    graph: MetaGraph
    warnings: tuple[Diagnostic, ...]
    schedule: MixSchedule | None = None
    train: TrainSettings = DEFAULTS

    def render_warnings(self) -> str:
        """The warnings in compiler form, each with its source line and caret."""
        return "\n".join(w.render(self.spec.source) for w in self.warnings)


def compile_text(
    text: str,
    path: str = "<string>",
    *,
    mix: str | None = None,
    cluster_overrides: dict[str, Any] | None = None,
    train_overrides: dict[str, Any] | None = None,
) -> Compiled:
    """Parse, check and lower ``text``; raises ``SpecError`` with every error found.
    ``train_overrides``: ``TrainSettings`` fields that replace the train block's."""
    spec = parse(text, path)
    checked = check(
        spec, mix=mix, cluster_overrides=cluster_overrides, train_overrides=train_overrides
    )
    try:
        graph = lower(checked)
        schedule = _lower_phases(checked, graph)
    except SpecError as exc:  # a kind that fails while lowering: show the warnings too
        raise SpecError(list(exc.diagnostics) + list(checked.warnings), source=text) from None
    return Compiled(spec, graph, checked.warnings, schedule, checked.train)


def _lower_phases(checked: Checked, graph: MetaGraph) -> MixSchedule | None:
    """A MetaGraph per phase of the schedule, each mix lowered once (``graph`` is the
    selected mix's, which is the first phase's)."""
    if not checked.phases:
        return None
    graphs = {checked.mix: graph}
    for p in checked.phases:
        if p.mix not in graphs:
            graphs[p.mix] = lower(replace(checked, tasks=p.tasks, mix=p.mix))
    return MixSchedule(tuple(Phase(p.first_step, p.mix, graphs[p.mix]) for p in checked.phases))


def compile_file(
    path: str | Path,
    *,
    mix: str | None = None,
    cluster_overrides: dict[str, Any] | None = None,
    train_overrides: dict[str, Any] | None = None,
) -> Compiled:
    """``compile_text`` on a file's contents, with the file's path in every diagnostic."""
    return compile_text(
        read_spec_text(path),
        str(path),
        mix=mix,
        cluster_overrides=cluster_overrides,
        train_overrides=train_overrides,
    )


def read_spec_text(path: str | Path) -> str:
    """A spec file's text; a missing, unreadable or non-UTF-8 file is a ``SpecError``."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
    return decode_spec(data, str(path))


def decode_spec(data: bytes, path: str = "<bytes>") -> str:
    """Spec bytes as text: UTF-8, with an optional byte-order mark (some editors write one)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        message = f"the file is not UTF-8 text: byte {data[exc.start]:#04x} cannot be decoded"
        raise SpecError(Diagnostic("error", message, SourceSpan(path, line, column))) from None
