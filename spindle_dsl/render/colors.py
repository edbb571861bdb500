"""One colour per task, shared by every picture the project draws.

A reader who learns "image_chat is blue" in the MetaGraph must find it blue again in the wave
plan, the timeline, the HTML report and Perfetto. So colours are assigned by a task's position in
a fixed task order (never by hashing its name, which would change colours when a task is
renamed and could give two tasks the same colour), and every renderer asks this module.

The base hues are a ten-colour qualitative palette chosen to stay distinguishable for common
colour-vision deficiencies; the light variant (the base mixed with white) is the fill behind
black text, the base is the border and the bar colour.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Qualitative hues in the order tasks receive them (blue, orange, green, red, purple, teal,
# yellow, pink, brown, grey).
BASE_HUES: tuple[str, ...] = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)

FROZEN_FILL = "#eeeeee"  # the fill that marks frozen MetaOps, whatever their task
MODALITY_FILL = "#ffffff"
IDLE_FILL = "#f2f2f2"


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    h = hex_colour.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def _hex(rgb: Iterable[float]) -> str:
    return "#" + "".join(f"{max(0, min(255, round(c))):02x}" for c in rgb)


def mix(hex_colour: str, other: str, weight: float) -> str:
    """``weight`` of ``other`` blended into ``hex_colour`` (0 keeps it, 1 gives ``other``)."""
    a, b = _rgb(hex_colour), _rgb(other)
    return _hex(x + (y - x) * weight for x, y in zip(a, b, strict=True))


def text_on(hex_colour: str) -> str:
    """Black or white, whichever reads better on ``hex_colour`` (WCAG relative luminance)."""

    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in _rgb(hex_colour))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "#000000" if luminance > 0.179 else "#ffffff"


@dataclass(frozen=True)
class TaskColour:
    """The colours of one task: ``base`` for bars and borders, ``light`` as a fill under text."""

    task: str
    base: str
    light: str
    text: str  # the text colour that reads on ``base``


@dataclass(frozen=True)
class Palette:
    """Colours for an ordered list of tasks; tasks past the tenth reuse hues, darker each round."""

    tasks: tuple[str, ...]
    colours: tuple[TaskColour, ...]

    def __getitem__(self, task: str) -> TaskColour:
        for c in self.colours:
            if c.task == task:
                return c
        raise KeyError(f"task '{task}' has no colour (known: {', '.join(self.tasks)})")


def palette(tasks: Sequence[str]) -> Palette:
    """Assign colours to ``tasks`` in the order given (duplicates keep their first colour)."""
    ordered = tuple(dict.fromkeys(tasks))
    colours = []
    for i, task in enumerate(ordered):
        round_, slot = divmod(i, len(BASE_HUES))
        base = mix(BASE_HUES[slot], "#000000", min(0.25 * round_, 0.6))
        colours.append(TaskColour(task, base, mix(base, "#ffffff", 0.65), text_on(base)))
    return Palette(ordered, tuple(colours))


def task_order(metaop_tasks: Iterable[str], declared: Iterable[str] = ()) -> tuple[str, ...]:
    """The order tasks get colours in: first appearance among the MetaOps, then any declared
    task that runs nothing. Plans keep the MetaGraph's MetaOp order, so a graph and its plan
    give the same order and so the same colours."""
    return tuple(dict.fromkeys([*metaop_tasks, *declared]))
