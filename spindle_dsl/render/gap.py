"""The gap between a plan's iteration and its lower bound, in words, term by term.

Why. "1.25x the bound" says a plan may be improvable, not where: the gap can sit in the
compute (wave barriers, allocations the LP mixes), in the optimizer's per-part work, in the
activation moves or in the loss phase, and each calls for another change. The plan
splits it (``Plan.gap_split``); this module words the split the same way for the CLI summary,
the HTML report and the widget.
"""

from __future__ import annotations

from collections.abc import Mapping

from spindle_dsl.plan.model import GAP_TERMS

SMALLEST_S = 5e-5  # terms under this many seconds are left out of the sentence


def gap_terms(split: Mapping[str, float]) -> list[tuple[str, float, float]]:
    """(words, seconds, share of the gap) per term, the largest first; terms under
    ``SMALLEST_S`` left out; empty where the gap is nil or not split."""
    gap = sum(split.values())
    if not split or gap <= 0:
        return []
    shown = [(k, v) for k, v in split.items() if abs(v) >= SMALLEST_S]
    shown.sort(key=lambda kv: -abs(kv[1]))
    return [(GAP_TERMS.get(k, k), v, v / gap) for k, v in shown]


def gap_text(split: Mapping[str, float]) -> str | None:
    """``gap to the bound: 8.83 ms = optimizer over its floor 6.57 (74%) + ...``; None where
    there is nothing to split."""
    terms = gap_terms(split)
    if not terms:
        return None
    text = f"gap to the bound: {sum(split.values()) * 1e3:.2f} ms ="
    for i, (words, secs, share) in enumerate(terms):
        sign = ("" if i == 0 else " +") if secs >= 0 else " -"
        text += f"{sign} {words} {abs(secs) * 1e3:.2f} ({abs(share):.0%})"
    return text
