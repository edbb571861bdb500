"""Measured spans of a run, written as a Chrome trace in the same form as the predicted one.

Each rank records what it spends time on (a stage's forward or backward, an exchange phase, the
loss, the gradient reduction, the optimizer step) against the wall clock, so spans of different
ranks on one machine line up. Rank 0 gathers them and writes one trace: ``traceEvents`` of
``ph: "X"`` complete events in microseconds, a process per node and a thread per device, as
``spindle render --what trace`` writes the plan's prediction, so the two open side by side in
Perfetto or chrome://tracing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from spindle_dsl.atomic import write_atomic


@dataclass(frozen=True)
class Span:
    """One measured interval on one rank (seconds since the epoch)."""

    rank: int
    name: str
    cat: str  # "forward", "backward", "exchange", "loss", "reduce", "optimizer", "step"
    start: float
    end: float
    args: tuple[tuple[str, object], ...] = ()


class Tracer:
    """Collects spans on one rank; a disabled tracer costs one branch per span."""

    def __init__(self, rank: int, enabled: bool):
        self.rank, self.enabled = rank, enabled
        self.spans: list[Span] = []

    @contextmanager
    def span(self, name: str, cat: str, **args: object) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        start = time.time()
        try:
            yield
        finally:
            self.spans.append(Span(self.rank, name, cat, start, time.time(), tuple(args.items())))


def chrome_trace(spans: Sequence[Span], devices_per_node: int, title: str) -> dict:
    """The Chrome trace object: pid = node, tid = device (= rank), times in µs from the first."""
    t0 = min((s.start for s in spans), default=0.0)
    events: list[dict] = []
    ranks = sorted({s.rank for s in spans})
    for node in sorted({r // devices_per_node for r in ranks}):
        events.append(
            {"name": "process_name", "ph": "M", "pid": node, "args": {"name": f"node {node}"}}
        )
    for r in ranks:
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": r // devices_per_node,
                "tid": r,
                "args": {"name": f"device {r}"},
            }
        )
    for s in spans:
        events.append(
            {
                "name": s.name,
                "cat": s.cat,
                "ph": "X",
                "ts": round((s.start - t0) * 1e6, 3),
                "dur": round((s.end - s.start) * 1e6, 3),
                "pid": s.rank // devices_per_node,
                "tid": s.rank,
                "args": dict(s.args),
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}


def write_trace(path: str | Path, spans: Sequence[Span], devices_per_node: int, title: str) -> None:
    write_atomic(path, json.dumps(chrome_trace(spans, devices_per_node, title)) + "\n")
