"""The ``schedule`` block: which mix applies from which completed optimizer step.

A schedule is a list of phases. Entry ``STEP: MIX`` says that once ``STEP`` optimizer steps
have completed, the run trains ``MIX`` (so ``3: main`` applies from the fourth step, which the
step log numbers 4). The checks here are about the block alone and the mixes it names: one
schedule per spec, a first entry at step 0 (otherwise the first steps would have no mix),
steps strictly increasing, mixes that exist. What a schedule means for the tasks (a task that
no phase trains) is judged by the checker, which knows the batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spindle_dsl.language.ast import NOWHERE, Loc, ScheduleDecl
from spindle_dsl.language.check_mixes import Mix
from spindle_dsl.language.reporter import Reporter
from spindle_dsl.language.suggest import did_you_mean


@dataclass(frozen=True)
class SchedulePhase:
    """One checked entry: from ``first_step`` completed steps on, the run trains ``mix``."""

    first_step: int
    mix: str
    loc: Loc = field(default=NOWHERE, compare=False, repr=False)


def resolve_schedule(
    decls: list[ScheduleDecl], r: Reporter, mixes: dict[str, Mix | None]
) -> tuple[SchedulePhase, ...]:
    """The phases of the spec's schedule (empty without one). Entries with errors are
    reported and left out; the caller raises before anything uses a partial schedule."""
    if not decls:
        return ()
    first, *others = sorted(decls, key=lambda d: (d.loc.line, d.loc.column))
    for d in others:
        r.error(
            f"a spec has one schedule; another begins on line {first.loc.line}",
            d.loc.head(len("schedule")),
            hint="list every entry in one schedule block",
        )
    if not first.entries:
        r.error(
            "the schedule lists no mix",
            first.loc.head(len("schedule")),
            hint="add entries 'STEP: MIX', the first at step 0",
        )
        return ()
    phases: list[SchedulePhase] = []
    previous: int | None = None
    for i, entry in enumerate(first.entries):
        step = r.integer(entry.step, "a schedule step", minimum=0)
        if step is not None:
            if i == 0 and step != 0:
                r.error(
                    f"the schedule's first entry must be at step 0, got {step}",
                    entry.step.loc,
                    hint="steps count completed optimizer steps; the run starts at 0",
                )
                step = None
            elif previous is not None and step <= previous:
                r.error(
                    f"schedule step {step} must come after step {previous} of the entry before",
                    entry.step.loc,
                    hint="list the entries in increasing step order, each step once",
                )
                step = None
            else:
                previous = step
        name = entry.mix.name
        if name not in mixes:
            listed = ", ".join(mixes) if mixes else "none: declare one with mix NAME { ... }"
            r.error(
                f"unknown mix '{name}' in the schedule{did_you_mean(name, list(mixes))}",
                entry.mix.loc,
                hint=f"the spec's mixes: {listed}",
            )
            continue
        if step is None:
            continue
        if phases and phases[-1].mix == name:
            r.warning(
                f"mix '{name}' follows itself in the schedule: the entry at step {step} "
                "changes nothing",
                entry.loc,
            )
            continue
        phases.append(SchedulePhase(step, name, entry.loc))
    return tuple(phases)
