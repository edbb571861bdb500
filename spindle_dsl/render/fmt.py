"""Number formatting shared by every picture, so that a figure reads the same everywhere.

Plans span microseconds (a tiny CPU model) to minutes (a 7B model on one device), FLOPs span
MFLOP to EFLOP, and device sets are long lists; a renderer that printed raw floats or full
device lists would give unreadable labels. These helpers pick a unit from the value itself.
"""

from __future__ import annotations

from collections.abc import Iterable

_SI = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def sig3(x: float) -> str:
    """Three significant figures without switching to exponent notation (1234 -> "1234")."""
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def fmt_flops(flops: float) -> str:
    """``4.41 PFLOP``: three significant figures with an SI prefix."""
    for scale, prefix in _SI:
        if abs(flops) >= scale:
            return f"{sig3(flops / scale)} {prefix}FLOP"
    return f"{sig3(flops)} FLOP"


def fmt_bytes(n: float) -> str:
    """``13.2 GiB``: binary units, because device memory is sized in them."""
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= scale:
            return f"{sig3(n / scale)} {unit}"
    return f"{int(n)} B"


def time_unit(seconds: float) -> tuple[float, str]:
    """The scale and unit that show ``seconds`` (a plan's length) with a few digits."""
    if seconds >= 1:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def fmt_seconds(seconds: float) -> str:
    """``12.3 ms``: three significant figures in the unit that suits the value."""
    scale, unit = time_unit(abs(seconds)) if seconds else (1.0, "s")
    return f"{sig3(seconds * scale)} {unit}"


def device_ranges(devices: Iterable[int]) -> str:
    """``0-15, 32-47``: runs of consecutive ids collapsed, so 64 devices fit in a label."""
    ids = sorted(set(devices))
    if not ids:
        return "none"
    runs: list[tuple[int, int]] = []
    start = prev = ids[0]
    for d in ids[1:]:
        if d != prev + 1:
            runs.append((start, prev))
            start = d
        prev = d
    runs.append((start, prev))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def device_runs(devices: Iterable[int]) -> list[tuple[int, int]]:
    """Runs of consecutive ids as ``(first, count)``: one bar per run in the timeline."""
    ids = sorted(set(devices))
    runs: list[tuple[int, int]] = []
    for d in ids:
        if runs and runs[-1][0] + runs[-1][1] == d:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((d, 1))
    return runs
