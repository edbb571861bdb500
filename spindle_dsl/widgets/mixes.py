"""Task-weight overrides, expressed as an ordinary mix block appended to the spec.

The widget lets a user drag each task's weight without editing the spec text. Rather than
re-implementing the language's batch rule (largest-remainder rounding, tasks left out of a mix,
their warnings), the session appends a generated ``mix`` block with the new weights and selects
it. The language stage then derives every batch exactly as it would for a hand-written mix, and
the exported spec text reproduces the plan with ``spindle plan --mix NAME``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spindle_dsl.errors import SpecError

CUSTOM_MIX = "custom"


@dataclass(frozen=True)
class MixInfo:
    """A mix as declared: its global batch and each task's weight, in declaration order."""

    name: str
    global_batch: int
    weights: tuple[tuple[str, float], ...]

    def weight(self, task: str) -> float:
        """The task's weight; 0 for a task this mix leaves out."""
        return dict(self.weights).get(task, 0.0)


def format_weight(w: float) -> str:
    """A plain decimal (no exponent), as short as it can be without losing the slider's value."""
    text = f"{w:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def merged_weights(base: MixInfo, overrides: Mapping[str, float]) -> dict[str, float]:
    """The base mix's weights with ``overrides`` applied; tasks at weight 0 are left out."""
    out = dict(base.weights)
    for task, w in overrides.items():
        if not isinstance(w, int | float) or math.isnan(w) or w < 0:
            raise SpecError(f"the weight of task '{task}' must be a number >= 0, got {w!r}")
        out[task] = float(w)
    return {t: w for t, w in out.items() if w > 0}


def custom_mix_text(
    text: str, base: MixInfo, overrides: Mapping[str, float], taken: Iterable[str] = ()
) -> tuple[str, str] | None:
    """``(text with a generated mix appended, its name)``, or None when nothing changes."""
    weights = merged_weights(base, overrides)
    if weights == {t: w for t, w in base.weights if w > 0}:
        return None
    if not weights:
        raise SpecError(
            f"every task of mix '{base.name}' has weight 0: give at least one task a weight > 0"
        )
    used = set(taken) | {base.name}
    name = CUSTOM_MIX
    i = 2
    while name in used or name in text:
        name = f"{CUSTOM_MIX}_{i}"
        i += 1
    lines = [
        "",
        f"# weights set in the planner widget, starting from mix '{base.name}'",
        f"mix {name} {{",
        f"  global_batch = {base.global_batch}",
        *(f"  {task} = {format_weight(w)}" for task, w in weights.items()),
        "}",
        "",
    ]
    sep = "" if text.endswith("\n") else "\n"
    return text + sep + "\n".join(lines), name
