"""Measured spans of a run, written as a Chrome trace in the same form as the predicted one.

Each rank records what it spends time on (a stage's forward or backward, an exchange phase, the
loss, the gradient reduction, the optimizer step) against the wall clock, so spans of different
ranks on one machine line up. Rank 0 gathers them and hands them to the renderer's trace writer
(``spindle_dsl.render.trace``), the one that writes the plan's prediction: a process per node,
a thread per device, ``ph: "X"`` events in microseconds, and flow arrows where activations
cross device groups, so the measured and the predicted trace open side by side in Perfetto.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spindle_dsl.render import trace as chrome

from .schedule import Schedule


@dataclass(frozen=True)
class Span:
    """One measured interval on one rank (seconds since the epoch)."""

    rank: int
    name: str
    cat: str  # "forward", "backward", "exchange", "loss", "reduce", "optimizer", "step"
    start: float
    end: float
    args: tuple[tuple[str, Any], ...] = ()


class Tracer:
    """Collects spans on one rank; a disabled tracer costs one branch per span.

    A span is wall-clock time. On a CUDA device kernels run asynchronously, so a span that
    only read the clock would measure the kernel launches; while tracing, the tracer waits for
    the compute stream at each span's start and end, so a span holds the GPU work it
    launched. The communication streams are not waited for, so the gradient reductions that
    the backward overlaps keep overlapping. While ``torch.profiler`` records, each span is
    also a ``record_function`` region, so it carries its name in the profiler's trace. On a
    CPU device neither changes what is measured."""

    def __init__(self, rank: int, enabled: bool, device: torch.device | None = None):
        self.rank, self.enabled = rank, enabled
        self.spans: list[Span] = []
        self._cuda = device if device is not None and device.type == "cuda" else None

    def _sync(self) -> None:
        if self._cuda is not None:
            torch.cuda.current_stream(self._cuda).synchronize()

    @contextmanager
    def span(self, name: str, cat: str, **args: Any) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self._sync()
        start = time.time()
        try:
            if torch.autograd._profiler_enabled():  # a region only where a profiler records
                with torch.profiler.record_function(f"{cat}:{name}"):
                    yield
            else:
                yield
        finally:
            self._sync()
            self.spans.append(Span(self.rank, name, cat, start, time.time(), tuple(args.items())))


def _flows(
    spans: Sequence[chrome.Span], schedule: Schedule | Callable[[int], Schedule]
) -> list[chrome.Flow]:
    """An arrow per step and per activation flow between different device groups: from the end
    of the producing stage's forward on its first device to the start of the consuming stage's
    forward on its first device. ``schedule``: the run's, or its schedule at each 1-based step
    (a run that switches plans)."""
    forward = {
        (s.args["step"], s.args["metaop"], s.args["stage"], s.device): s
        for s in spans
        if s.category == "forward"
    }
    out: list[chrome.Flow] = []
    steps = sorted({k[0] for k in forward})
    for step in steps:
        at = schedule(step) if callable(schedule) else schedule
        for flow in at.flows:
            if flow.src == flow.dst or flow.phase == at.n_waves:  # the loss phase: no stage
                continue
            metaop = flow.key.split("<")[0].split("#")[0]
            dst_stage = 0 if "<" in flow.key else int(flow.key.split("#")[1])
            src = forward.get((step, *flow.source, flow.src[0]))
            dst = forward.get((step, metaop, dst_stage, flow.dst[0]))
            if src is None or dst is None:
                continue
            end = src.start_s + src.duration_s - min(1e-6, src.duration_s / 2)
            begin = dst.start_s + min(1e-6, dst.duration_s / 2)
            out.append(
                chrome.Flow(
                    len(out) + 1,
                    "activations",
                    chrome.FlowEnd(src.node, src.device, end),
                    chrome.FlowEnd(dst.node, dst.device, max(begin, end)),
                    args={"flow": flow.key, "step": step},
                )
            )
    return out


def measured_trace(
    spans: Sequence[Span],
    schedule: Schedule | Callable[[int], Schedule],
    devices_per_node: int,
    metadata: dict[str, Any],
) -> dict[str, Any]:
    """The Chrome trace of the gathered spans, times from the first span of the run."""
    t0 = min((s.start for s in spans), default=0.0)
    converted = [
        chrome.Span(
            s.rank // devices_per_node,
            s.rank,
            s.name,
            s.start - t0,
            s.end - s.start,
            s.cat,
            dict(s.args),
        )
        for s in spans
    ]
    flows = _flows(converted, schedule)
    return chrome.chrome_trace(converted, flows, metadata={"source": "measured", **metadata})


def write_measured_trace(
    path: str | Path,
    spans: Sequence[Span],
    schedule: Schedule | Callable[[int], Schedule],
    devices_per_node: int,
    metadata: dict[str, Any],
) -> None:
    chrome.write_trace(path, measured_trace(spans, schedule, devices_per_node, metadata))
