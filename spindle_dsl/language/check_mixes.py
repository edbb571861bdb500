"""Data mixes: weights per task, and the batches they give under a global batch size.

Every mix in the file is checked (a typo in a mix nobody selects today is still a typo), but
only the selected one sets batches. Batches are the largest-remainder rounding of
``global_batch * weight / sum(weights)``: each task gets the floor of its exact share, and the
samples left over go one each to the largest fractional parts (ties to the task listed
first), so the batches always add up to exactly ``global_batch``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from spindle_dsl.language import limits
from spindle_dsl.language.ast import MixDecl, Setting
from spindle_dsl.language.reporter import Reporter
from spindle_dsl.language.suggest import did_you_mean

GLOBAL_BATCH = "global_batch"


@dataclass(frozen=True)
class Mix:
    """A valid mix: its global batch and each listed task's weight, in order."""

    name: str
    global_batch: int
    weights: tuple[tuple[str, float], ...]
    decl: MixDecl

    def batches(self) -> dict[str, int]:
        """Each listed task's batch (largest remainder; sums to ``global_batch``)."""
        return dict(
            zip(
                [t for t, _ in self.weights],
                largest_remainder(self.global_batch, [w for _, w in self.weights]),
                strict=True,
            )
        )


def largest_remainder(total: int, weights: list[float]) -> list[int]:
    """Split ``total`` in proportion to ``weights`` into integers that sum to ``total``.

    The shares are exact fractions of the weights as written (0.1 is one tenth, not the
    nearest double), so equal remainders tie exactly and the tie-break is the listed order.
    """
    exact_weights = [Fraction(repr(w)) if isinstance(w, float) else Fraction(w) for w in weights]
    whole = sum(exact_weights)
    exact = [total * w / whole for w in exact_weights]
    counts = [math.floor(x) for x in exact]
    left = total - sum(counts)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    return counts


def resolve_mixes(
    decls: list[MixDecl], r: Reporter, task_names: list[str]
) -> dict[str, Mix | None]:
    """Every mix by name: a ``Mix``, or None when it has errors (already reported)."""
    return {d.name.name: _resolve(d, r, task_names) for d in decls}


def _resolve(d: MixDecl, r: Reporter, task_names: list[str]) -> Mix | None:
    name = d.name.name
    ok = True
    global_batch: int | None = None
    weights: list[tuple[str, float]] = []
    seen: dict[str, Setting] = {}
    for s in d.settings:
        key = s.key.name
        if key in seen:
            r.error(f"'{key}' is set twice in mix '{name}'", s.key.loc)
            ok = False
            continue
        seen[key] = s
        if key == GLOBAL_BATCH:
            global_batch = r.integer(
                s.value, f"global_batch of mix '{name}'", at=s.loc, limit=limits.BATCH
            )
            ok = ok and global_batch is not None
        elif key not in task_names:
            r.error(
                f"unknown task '{key}' in mix '{name}'{did_you_mean(key, task_names)}",
                s.key.loc,
                hint="a mix lists global_batch and a weight per task: TASK = WEIGHT",
            )
            ok = False
        else:
            weight = r.positive(
                s.value, f"the weight of '{key}' in mix '{name}'", at=s.loc, limit=limits.WEIGHT
            )
            if weight is None:
                ok = False
            else:
                weights.append((key, weight))
    if GLOBAL_BATCH not in seen:
        r.error(f"mix '{name}' needs 'global_batch = N'", d.name.loc)
        ok = False
    if ok and not weights:
        r.error(
            f"mix '{name}' gives no task a weight",
            d.name.loc,
            hint="list tasks with their weights: TASK = WEIGHT",
        )
        ok = False
    if not ok or global_batch is None:
        return None
    return Mix(name, global_batch, tuple(weights), d)
