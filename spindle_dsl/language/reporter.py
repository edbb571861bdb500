"""Collect a spec's diagnostics, and read literal values with a diagnostic when they are wrong.

The checker never stops at the first problem: each check reports into one ``Reporter`` and
carries on with what it could resolve, so a user sees every independent error in one run.
The value readers return None after reporting, which callers treat as "unknown, say nothing
more about it" so that one bad literal does not cause a cascade of errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spindle_dsl.errors import Diagnostic, SpecError
from spindle_dsl.language.ast import Loc, Value
from spindle_dsl.language.limits import Limit


@dataclass
class Reporter:
    """Diagnostics for one file; ``errors`` come out in source order, then the warnings."""

    path: str
    source: str
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def error(self, message: str, loc: Loc | None = None, hint: str | None = None) -> None:
        self._add("error", message, loc, hint)

    def warning(self, message: str, loc: Loc | None = None, hint: str | None = None) -> None:
        self._add("warning", message, loc, hint)

    def _add(self, severity, message: str, loc: Loc | None, hint: str | None) -> None:
        span = loc.span(self.path) if loc is not None and loc.line > 0 else None
        self.diagnostics.append(Diagnostic(severity, message, span, hint))

    @property
    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)

    def sorted(self, severity: str) -> list[Diagnostic]:
        """One severity's diagnostics in source order (those without a place first)."""
        chosen = [d for d in self.diagnostics if d.severity == severity]
        return sorted(chosen, key=lambda d: (d.span.line, d.span.column) if d.span else (0, 0))

    def raise_if_errors(self) -> None:
        if self.has_errors:
            raise SpecError(self.sorted("error") + self.sorted("warning"), source=self.source)

    # --- reading literals -----------------------------------------------------------------
    def integer(
        self,
        value: Value,
        what: str,
        minimum: int = 1,
        at: Loc | None = None,
        limit: Limit | None = None,
    ) -> int | None:
        """An integer of at least ``minimum`` (and within ``limit``, ``limits``' bound for
        it); a value out of range is reported at ``at`` (the whole ``key = value``, where the
        caller has one) so the message shows its name."""
        if value.kind != "int":
            self.error(f"{what} must be a whole number, got {value.describe()}", value.loc)
            return None
        if int(value.value) < minimum:
            self.error(f"{what} must be at least {minimum}, got {value.value}", at or value.loc)
            return None
        return (
            int(value.value)
            if self.within(int(value.value), what, limit, at or value.loc)
            else None
        )

    def positive(
        self, value: Value, what: str, at: Loc | None = None, limit: Limit | None = None
    ) -> float | None:
        """A number greater than zero (an integer or a float), within ``limit``."""
        if value.kind not in ("int", "float"):
            self.error(f"{what} must be a number, got {value.describe()}", value.loc)
            return None
        if float(value.value) <= 0:
            self.error(f"{what} must be greater than 0, got {value.value}", at or value.loc)
            return None
        number = float(value.value)
        return number if self.within(number, what, limit, at or value.loc) else None

    def within(
        self, number: float, what: str, limit: Limit | None, loc: Loc | None, lower: bool = True
    ) -> bool:
        """Report ``number`` if ``limit`` refuses it; True when it is fine."""
        problem = limit.problem(number, what, lower) if limit is not None else None
        if problem:
            self.error(problem, loc)
        return problem is None

    def word(self, value: Value, what: str) -> str | None:
        """A bare word or a string (``loss = lm``, ``device = "A100-80GB"``)."""
        if value.kind not in ("name", "string"):
            self.error(f"{what} must be a name or a string, got {value.describe()}", value.loc)
            return None
        return str(value.value)
