"""The project's own error type and the diagnostics it carries.

Every problem a user can cause (a bad spec, a plan that does not fit, a worker that died) is a
``SpindleError``; the CLI prints its diagnostics and exits 1, so no user input surfaces as a
Python traceback. Diagnostics follow the compiler convention ``file:line:col: error: message``,
then the source line with a caret under the offending span, then an optional hint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class SourceSpan:
    """Where something stands in a source file: 1-based line and column, end column exclusive."""

    path: str
    line: int
    column: int
    end_column: int | None = None


@dataclass(frozen=True)
class Diagnostic:
    """One error or warning, tied to a source span when there is one."""

    severity: Severity
    message: str
    span: SourceSpan | None = None
    hint: str | None = None

    def render(self, source: str | None = None) -> str:
        """Format as ``path:line:col: severity: message`` with the line and a caret below it."""
        if self.span is None:
            head = f"{self.severity}: {self.message}"
        else:
            s = self.span
            head = f"{s.path}:{s.line}:{s.column}: {self.severity}: {self.message}"
        lines = [head]
        if self.span is not None and source is not None:
            text_lines = source.splitlines()
            if 1 <= self.span.line <= len(text_lines):
                text = text_lines[self.span.line - 1].expandtabs(1)
                start = max(self.span.column, 1)
                end = self.span.end_column if self.span.end_column else start + 1
                width = max(end - start, 1)
                lines.append(f"    {text}")
                lines.append("    " + " " * (start - 1) + "^" * width)
        if self.hint:
            lines.append(f"    hint: {self.hint}")
        return "\n".join(lines)


class SpindleError(Exception):
    """A problem the user can fix. Carries one or more diagnostics (errors first)."""

    def __init__(
        self,
        diagnostics: Diagnostic | str | list[Diagnostic] | tuple[Diagnostic, ...],
        source: str | None = None,
    ):
        if isinstance(diagnostics, str):
            diagnostics = [Diagnostic("error", diagnostics)]
        elif isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        self.source = source
        super().__init__(self.render())

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity == "error")

    def render(self) -> str:
        return "\n".join(d.render(self.source) for d in self.diagnostics)


class SpecError(SpindleError):
    """The spec text is wrong: syntax, names, values, widths, cycles, batches or mixes."""


class PlanError(SpindleError):
    """No valid plan exists for this graph on this cluster (say what does not fit and why)."""


class PlanFormatError(SpindleError):
    """A plan file is malformed or breaks an invariant of the plan format."""


class ExecutionError(SpindleError):
    """A training run failed: a worker died or hung, or a checkpoint does not match."""
