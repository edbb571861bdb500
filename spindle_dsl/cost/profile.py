"""The profile file and the cost model fitted from it.

``spindle profile`` writes one JSON object (``"format": "spindle-profile", "version": 1``):

```
{"format": "spindle-profile", "version": 1,
 "device": "cpu" | "cuda", "device_name": str, "torch": str, "threads": int, "dtype": str,
 "spec": str,
 "entries": [{"kind": str, "args": {...}, "tokens": int,
              "mode": "train" | "input_grad" | "forward",
              "metaops": [str],                 # the MetaOps of the spec this shape serves
              "samples": [{"batch": int, "flops": float, "seconds": float}],
              "segments": [{"from_flops": float, "to_flops": float | null,
                            "alpha_s": float, "beta_s_per_flop": float}]}]}
```

An entry is keyed by what determines a layer's time (kind, resolved args, input tokens, and
whether it trains, only passes gradients through, or runs forward only), so one profile serves
every MetaOp with that shape, in any mix and on any cluster size. ``flops`` is the per-device
forward+backward work of one layer at that per-device batch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from spindle_dsl.atomic import write_atomic
from spindle_dsl.cluster import Cluster
from spindle_dsl.cost import comm
from spindle_dsl.cost.analytic import backward_multiplier
from spindle_dsl.cost.base import Curve, Curves, SliceMemory
from spindle_dsl.cost.fit import PiecewiseFit, Segment
from spindle_dsl.cost.memory import MemoryInfoCache, slice_memory, slice_memory_bytes
from spindle_dsl.cost.memory_table import alone_bytes
from spindle_dsl.errors import SpindleError
from spindle_dsl.metagraph import ArgValue, MetaGraph, MetaOp

FORMAT = "spindle-profile"
VERSION = 1
Mode = Literal["train", "input_grad", "forward"]
ShapeKey = tuple[str, tuple[tuple[str, ArgValue], ...], int, str]


def mode_of(op: MetaOp) -> Mode:
    """Which passes a layer of ``op`` runs: full training, input gradients only, or forward."""
    if not op.needs_backward:
        return "forward"
    return "input_grad" if op.frozen else "train"


def shape_key(op: MetaOp) -> ShapeKey:
    return (op.kind, tuple(sorted(op.args)), op.tokens, mode_of(op))


@dataclass(frozen=True)
class Sample:
    batch: int
    flops: float  # per-device forward+backward FLOPs of one layer at this batch
    seconds: float  # measured (median) seconds of one layer forward+backward


@dataclass(frozen=True)
class ProfileEntry:
    kind: str
    args: tuple[tuple[str, ArgValue], ...]  # sorted by name
    tokens: int
    mode: Mode
    metaops: tuple[str, ...]
    samples: tuple[Sample, ...]
    fit: PiecewiseFit

    @property
    def key(self) -> ShapeKey:
        return (self.kind, self.args, self.tokens, self.mode)


@dataclass(frozen=True)
class Profile:
    device: str
    device_name: str
    torch: str
    threads: int
    dtype: str
    spec: str
    entries: tuple[ProfileEntry, ...]

    def lookup(self, op: MetaOp) -> ProfileEntry | None:
        key = shape_key(op)
        return next((e for e in self.entries if e.key == key), None)

    # --- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "device": self.device,
            "device_name": self.device_name,
            "torch": self.torch,
            "threads": self.threads,
            "dtype": self.dtype,
            "spec": self.spec,
            "entries": [
                {
                    "kind": e.kind,
                    "args": dict(e.args),
                    "tokens": e.tokens,
                    "mode": e.mode,
                    "metaops": list(e.metaops),
                    "samples": [
                        {"batch": s.batch, "flops": s.flops, "seconds": s.seconds}
                        for s in e.samples
                    ],
                    "segments": [
                        {
                            "from_flops": g.from_flops,
                            "to_flops": None if math.isinf(g.to_flops) else g.to_flops,
                            "alpha_s": g.alpha_s,
                            "beta_s_per_flop": g.beta_s_per_flop,
                        }
                        for g in e.fit.segments
                    ],
                }
                for e in self.entries
            ],
        }

    def write(self, path: str | os.PathLike[str]) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, d: Any, where: str = "<profile>") -> Profile:
        try:
            if d.get("format") != FORMAT or d.get("version") != VERSION:
                raise SpindleError(
                    f"{where}: not a spindle profile (want format '{FORMAT}' version {VERSION})"
                )
            entries = tuple(
                ProfileEntry(
                    kind=str(e["kind"]),
                    args=tuple(sorted(dict(e["args"]).items())),
                    tokens=int(e["tokens"]),
                    mode=e["mode"],
                    metaops=tuple(e.get("metaops", ())),
                    samples=tuple(
                        Sample(int(s["batch"]), float(s["flops"]), float(s["seconds"]))
                        for s in e["samples"]
                    ),
                    fit=PiecewiseFit(
                        tuple(
                            Segment(
                                float(g["from_flops"]),
                                math.inf if g["to_flops"] is None else float(g["to_flops"]),
                                float(g["alpha_s"]),
                                float(g["beta_s_per_flop"]),
                            )
                            for g in e["segments"]
                        )
                    ),
                )
                for e in d["entries"]
            )
            if any(not e.fit.segments for e in entries):
                raise SpindleError(f"{where}: an entry has no fitted segments")
            return cls(
                device=str(d["device"]),
                device_name=str(d.get("device_name", d["device"])),
                torch=str(d.get("torch", "")),
                threads=int(d.get("threads", 0)),
                dtype=str(d.get("dtype", "")),
                spec=str(d.get("spec", "")),
                entries=entries,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SpindleError(
                f"{where}: malformed profile ({type(exc).__name__}: {exc})"
            ) from None

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Profile:
        try:
            text = open(path, encoding="utf-8").read()  # noqa: SIM115
        except OSError as exc:
            raise SpindleError(f"cannot read profile {path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpindleError(
                f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"
            ) from None
        return cls.from_dict(data, where=str(path))


class ProfiledCostModel(comm.LinkPricing):
    """T_m(n) from measured layer times (data parallelism, idle devices allowed) plus the
    gradient all-reduce priced from the cluster's links."""

    def __init__(self, cluster: Cluster, profile: Profile, source: str = "profile"):
        self.cluster = cluster
        self.profile = profile
        self.source = source
        self._best_memo: dict[tuple[MetaOp, bool], list[tuple[int, float]]] = {}
        self._info = MemoryInfoCache()

    def _entry(self, op: MetaOp) -> ProfileEntry:
        entry = self.profile.lookup(op)
        if entry is None:
            raise self._missing([op])
        return entry

    def _missing(self, ops: Sequence[MetaOp]) -> SpindleError:
        names = ", ".join(f"{o.id} ({o.kind}, {o.tokens} tokens, {mode_of(o)})" for o in ops)
        return SpindleError(
            f"profile {self.source} has no measurement for {names}; run `spindle profile` "
            f"on this spec again"
        )

    def _time(self, op: MetaOp, dp: int, recompute: bool = False) -> float:
        """Measured layer time at ``dp``'s shard; recomputing reads the fit at the work of
        one more forward (the fit maps per-device FLOPs to seconds for this shape and mode)."""
        entry = self._entry(op)
        shard = comm.ceil_div(op.batch, dp)
        mult = backward_multiplier(op, recompute and op.needs_backward)
        per_sample = mult * op.forward_flops_per_layer / max(op.batch, 1)
        seconds = entry.fit.predict(per_sample * shard)
        if not op.frozen and dp > 1:
            bandwidth, latency = comm.link(
                self.cluster, comm.contiguous_group_spans_nodes(dp, self.cluster)
            )
            seconds += comm.ring_allreduce_seconds(op.param_bytes_per_layer, dp, bandwidth, latency)
        return max(seconds, 1e-9)

    def _best(self, op: MetaOp, recompute: bool = False) -> list[tuple[int, float]]:
        """(dp, seconds) for every n: the fastest dp <= n (idle devices allowed)."""
        key = (op, recompute)
        if key not in self._best_memo:
            out: list[tuple[int, float]] = []
            for n in range(1, self.cluster.devices + 1):
                t = self._time(op, n, recompute)
                out.append((n, t) if not out or t < out[-1][1] else out[-1])
            self._best_memo[key] = out
        return self._best_memo[key]

    def curves(self, graph: MetaGraph, recompute: frozenset[str] = frozenset()) -> Curves:
        missing = [op for op in graph.metaops if self.profile.lookup(op) is None]
        if missing:
            raise self._missing(missing)
        ns = tuple(range(1, self.cluster.devices + 1))
        return Curves(
            tuple(
                Curve(op.id, ns, tuple(t for _, t in self._best(op, op.id in recompute)))
                for op in graph.metaops
            ),
            source=self.source,
        )

    def memory_bytes(self, op: MetaOp, n: int, layers: int) -> int:
        dp = self._best(op)[n - 1][0]
        return slice_memory_bytes(op, layers, dp, 1, self.cluster, n)

    def alone_bytes(
        self,
        graph: MetaGraph,
        op: MetaOp,
        first: int,
        end: int,
        recompute: bool = False,
        zero_stage: int = 1,
    ) -> tuple[int, ...]:
        recompute = recompute and op.needs_backward
        dp = np.array([d for d, _ in self._best(op, recompute)])
        tp = np.ones(len(dp), dtype=int)
        info = self._info(graph, op)
        return alone_bytes(info, op, first, end, dp, tp, recompute, self.cluster, zero_stage)

    def slice_memory(
        self,
        graph: MetaGraph,
        op: MetaOp,
        n: int,
        first: int,
        end: int,
        recompute: bool = False,
        zero_stage: int = 1,
    ) -> SliceMemory:
        recompute = recompute and op.needs_backward
        dp = 1 if n == 1 else self._best(op, recompute)[n - 1][0]
        info = self._info(graph, op)
        return slice_memory(info, op, first, end, dp, 1, recompute, self.cluster, zero_stage)
