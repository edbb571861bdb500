"""The profile file and the cost model fitted from it.

``spindle profile`` writes one JSON object (``"format": "spindle-profile", "version": 1``):

```
{"format": "spindle-profile", "version": 1,
 "device": "cpu" | "cuda", "device_name": str, "torch": str, "threads": int, "dtype": str,
 "spec": str,
 "nproc": int, "backend": "gloo" | "nccl" | "",   # worker processes measured on (0: one
                                                   # process, no process group)
 "overheads": {...} | absent,                      # cost.overheads.StepOverheads.to_dict()
 "entries": [{"kind": str, "args": {...}, "tokens": int,
              "mode": "train" | "input_grad" | "forward",
              "metaops": [str],                 # the MetaOps of the spec this shape serves
              "samples": [{"batch": int, "flops": float, "seconds": float}],
              "segments": [{"from_flops": float, "to_flops": float | null,
                            "alpha_s": float, "beta_s_per_flop": float}],
              "first_layer_ratio": float,       # optional, see below
              "tp": int}]}                      # optional, see below (absent: 1)
```

An entry is keyed by what determines a layer's time (kind, resolved args, input tokens, and
whether it trains, only passes gradients through, or runs forward only), so one profile serves
every MetaOp with that shape, in any mix and on any cluster size. ``flops`` is the per-device
forward+backward work of one layer at that per-device batch.

``first_layer_ratio`` (a "train" entry, where some MetaOp of the shape reads only from MetaOps
without a backward pass, e.g. an adapter after frozen towers): the measured time of the layer
when its input needs no gradient over its time when it does, at the shape's largest batch,
the two timed in turns. Such a MetaOp's first layer skips only the input gradient of the
layer's first matmul, not a third of the layer: an mlp layer of two matmuls skips one of its
four backward matmuls (5/6 of the layer left), a transformer block far less. The curve of
that MetaOp is its layers' mean, ``((L - 1) + ratio) / L`` times the profiled time; a
profile without the measurement prices no saving.

``tp`` (an entry of a profile made with ``--nproc N``): the layer as a tensor-parallel group of
``tp`` ranks runs it (``ShardView``: each rank its slice of the layer on all the group's rows,
with the slice's all-reduces), timed at several rows per group; ``flops`` is then a ``tp``-th
of the rows' work, the share of one device, so the fit is read as a data-parallel entry's is.
A layout measured so replaces the estimate of ``ProfiledCostModel`` and can be chosen
unforced; one not measured (a degree above the worker count or the cores) keeps the estimate.

A profile made on N worker processes (``spindle profile --nproc N``) times the layers on as
many processes at once as the machine has cores for (so they contend for memory and caches as
in a run, but never time-slice: core sharing is priced per wave by the step model), and adds
``overheads``: the process group's collectives and point-to-point exchange, the optimizer, the
input stages, the loss heads and the fixed cost per stage (``cost.overheads``). The fitted
cost model then prices the runtime's whole step (``cost.step``): its curves are the layers'
compute alone, and the gradient reduction is priced once per step, as the runtime issues it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from spindle_dsl.atomic import write_atomic
from spindle_dsl.cluster import Cluster
from spindle_dsl.cost import comm
from spindle_dsl.cost.allocations import (
    ForcedCurve,
    StepCurve,
    curve_of,
    listed,
    shard_breakpoints,
)
from spindle_dsl.cost.analytic import backward_multiplier, tp_comm_seconds, tp_degrees
from spindle_dsl.cost.base import Curve, Curves, SliceMemory
from spindle_dsl.cost.fit import PiecewiseFit, Segment
from spindle_dsl.cost.memory import MemoryInfoCache, slice_memory, slice_memory_bytes
from spindle_dsl.cost.memory_table import alone_bytes
from spindle_dsl.cost.overheads import StepOverheads, analytic_overheads
from spindle_dsl.cost.step import StepModel, make_step_model
from spindle_dsl.errors import SpindleError
from spindle_dsl.metagraph import ArgValue, MetaGraph, MetaOp

FORMAT = "spindle-profile"
VERSION = 1
# How far a profiled prediction of one plan against another can be off: the measured ratio of
# two plans' step times against their predicted ratio (``bench/predict_accuracy.py``,
# docs/benchmarks.md). The default scheduler keeps the data-parallel plan unless another is
# predicted faster by more than this.
PREDICTION_MARGIN = 0.05
Mode = Literal["train", "input_grad", "forward"]
# (kind, resolved args, input tokens, mode, tensor-parallel degree)
ShapeKey = tuple[str, tuple[tuple[str, ArgValue], ...], int, str, int]


def mode_of(op: MetaOp) -> Mode:
    """Which passes a layer of ``op`` runs: full training, input gradients only, or forward."""
    if not op.needs_backward:
        return "forward"
    return "input_grad" if op.frozen else "train"


def shape_key(op: MetaOp, tp: int = 1) -> ShapeKey:
    """What determines the time of a layer of ``op`` run ``tp``-way tensor parallel."""
    return (op.kind, tuple(sorted(op.args)), op.tokens, mode_of(op), tp)


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
    # the layer with an input that needs no gradient over the layer as timed (module docstring)
    first_layer_ratio: float | None = None
    tp: int = 1  # the tensor-parallel degree it was timed at (module docstring)

    @property
    def key(self) -> ShapeKey:
        return (self.kind, self.args, self.tokens, self.mode, self.tp)


@dataclass(frozen=True)
class Profile:
    device: str
    device_name: str
    torch: str
    threads: int
    dtype: str
    spec: str
    entries: tuple[ProfileEntry, ...]
    nproc: int = 0  # worker processes it was measured on (0: this process, no process group)
    backend: str = ""  # their process group's backend
    overheads: StepOverheads | None = None  # measured with --nproc (see the module docstring)

    def lookup(self, op: MetaOp, tp: int = 1) -> ProfileEntry | None:
        key = shape_key(op, tp)
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
            "nproc": self.nproc,
            "backend": self.backend,
            **({"overheads": self.overheads.to_dict()} if self.overheads else {}),
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
                    **(
                        {"first_layer_ratio": e.first_layer_ratio}
                        if e.first_layer_ratio is not None
                        else {}
                    ),
                    **({"tp": e.tp} if e.tp > 1 else {}),
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
                    first_layer_ratio=_ratio(e.get("first_layer_ratio")),
                    tp=_degree(e.get("tp", 1)),
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
                nproc=int(d.get("nproc", 0)),
                backend=str(d.get("backend", "")),
                overheads=(
                    StepOverheads.from_dict(d["overheads"], where) if "overheads" in d else None
                ),
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


def _ratio(value: Any) -> float | None:
    """A stored ``first_layer_ratio``: a float in (0, 1], or None where absent."""
    if value is None:
        return None
    ratio = float(value)
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"first_layer_ratio {ratio} is outside (0, 1]")
    return ratio


def _degree(value: Any) -> int:
    """A stored ``tp``: an int of at least 1."""
    degree = int(value)
    if degree < 1 or degree != value:
        raise ValueError(f"tp {value!r} is not a degree of at least 1")
    return degree


def data_parallel_rate(entries: Sequence[ProfileEntry]) -> float | None:
    """Seconds per FLOP at the largest batch, the median over the data-parallel entries (a
    tensor-parallel entry's time holds its all-reduces): the rate of work no layer prices."""
    rates = sorted(
        e.samples[-1].seconds / e.samples[-1].flops for e in entries if e.samples and e.tp == 1
    )
    return rates[len(rates) // 2] if rates else None


def first_input_needs_no_gradient(graph: MetaGraph, op: MetaOp) -> bool:
    """Whether a trained MetaOp's first layer gets an input that needs no gradient: its inputs
    all come from MetaOps without a backward pass (frozen towers), none from a modality's
    input stage. False where ``graph`` leaves an input's MetaOp out (a sub-graph of the
    MetaOps being priced: the planner includes their inputs' MetaOps, ``planner.model.levers``)."""
    if op.frozen or not op.needs_backward or not op.inputs:
        return False
    for i in op.inputs:
        source = None if i.from_modality else graph.find_op(i.source)
        if source is None or source.needs_backward:
            return False
    return True


def first_layer_saving(graph: MetaGraph, op: MetaOp, ratio: float | None) -> float:
    """The share of a profiled layer time ``op``'s layers take on average: where its first
    layer's input needs no gradient (``first_input_needs_no_gradient``), that layer takes
    ``ratio`` of the profiled time (measured, ``ProfileEntry.first_layer_ratio``; None: not
    measured, no saving), so ``((L - 1) + ratio) / L``; 1 otherwise."""
    if ratio is None or not first_input_needs_no_gradient(graph, op):
        return 1.0
    return (op.layers - 1 + ratio) / op.layers


def _tp_only(option: tuple[int, int]) -> tuple[int, int] | None:
    """A curve point's layout where it is tensor parallel (``allocations.curve_of``)."""
    return option if option[1] > 1 else None


def _scaled(curve: Curve, factor: float) -> Curve:
    """``curve`` with every time multiplied by ``factor``."""
    if factor == 1.0:
        return curve
    return Curve(curve.metaop, curve.ns, tuple(t * factor for t in curve.seconds), curve.layouts)


class ProfiledCostModel(comm.LinkPricing):
    """T_m(n) from measured layer times (data parallelism, idle devices allowed); the rest of
    the step (gradient reduction, exchange, losses, optimizer) from the profile's measured
    overheads, or the analytic ones for a profile made without ``--nproc``.

    A tensor-parallel layout is priced from its own entry where the profile measured it (the
    module docstring), and then competes with data parallelism point by point. With ``tp``
    (``--tp K``) an entry of a kind that splits K-way runs K-way on at least K devices; a
    degree the profile did not measure is an estimate: the data-parallel fit's time at a K-th
    of the shard's FLOPs (its fixed cost per layer kept whole) plus the layer's activation
    all-reduces at the measured all-reduce line (``tp_comm_seconds``)."""

    prediction_margin = PREDICTION_MARGIN

    def __init__(
        self, cluster: Cluster, profile: Profile, source: str = "profile", tp: int | None = None
    ):
        self.cluster = cluster
        self.profile = profile
        self.source = source
        self.tp = tp
        self.overheads = profile.overheads or analytic_overheads(cluster)
        self._best_memo: dict[tuple[MetaOp, bool], Any] = {}
        self._info = MemoryInfoCache()

    def step_model(self, graph: MetaGraph) -> StepModel:
        """The runtime's step with this profile's overheads; the gradient reduction is priced
        there, once per step, so the curves leave it out."""
        return make_step_model(graph, self.overheads, grad_in_curves=False)

    def allreduce_seconds(self, nbytes: float, devices: Sequence[int], cluster: Cluster) -> float:
        return self.overheads.all_reduce.seconds(nbytes, len(set(devices)))

    def transfer_seconds(
        self, nbytes: float, src: Sequence[int], dst: Sequence[int], cluster: Cluster
    ) -> float:
        """One exchange phase: the measured point-to-point line at the bytes the busiest
        device sends or receives (a profile without ``--nproc``: the cluster's links)."""
        if self.profile.overheads is None:
            return comm.transfer_seconds(nbytes, src, dst, cluster)
        return self.overheads.p2p.at(comm.busiest_bytes(nbytes, src, dst))

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

    def _time(self, op: MetaOp, dp: int, recompute: bool = False, tp: int = 1) -> float:
        """Measured layer time at ``dp``'s shard; recomputing reads the fit at the work of
        one more forward (the fit maps per-device FLOPs to seconds for this shape and mode);
        ``tp > 1`` reads that degree's entry, or makes the estimate of the class docstring. No
        gradient all-reduce: the step model prices the reduction as the runtime issues it."""
        shard = comm.ceil_div(op.batch, dp)
        rc = recompute and op.needs_backward
        per_sample = backward_multiplier(op, rc) * op.forward_flops_per_layer / max(op.batch, 1)
        work = per_sample * shard / tp
        measured = self.profile.lookup(op, tp) if tp > 1 else None
        if measured is not None:
            return max(measured.fit.predict(work), 1e-9)
        compute = max(self._entry(op).fit.predict(work), 1e-9)
        if tp == 1:
            return compute
        line = self.overheads.all_reduce.seconds
        return compute + tp_comm_seconds(op, shard, tp, rc, self.cluster, line)

    def _forced(self, op: MetaOp) -> int | None:
        """K of ``--tp K`` where this op runs K-way on K or more devices, else None."""
        if self.tp is None or self.tp == 1:
            return None
        return self.tp if self.tp in tp_degrees(op, self.cluster, self.tp) else None

    def _measured_degrees(self, op: MetaOp) -> tuple[int, ...]:
        """The tensor-parallel degrees of ``op`` the profile timed and the runtime can run
        (none under ``--tp 1``)."""
        if self.tp == 1:
            return ()
        allowed = tp_degrees(op, self.cluster)[1:]
        return tuple(k for k in allowed if self.profile.lookup(op, k) is not None)

    def _best(self, op: MetaOp, recompute: bool = False) -> StepCurve | ForcedCurve:
        """T(n) for every n: the fastest layout on at most n devices (idle devices allowed),
        from the dp at the batch's shard breakpoints only (``cost.allocations``: a fixed shard
        is fastest on the fewest replicas, as the gradient all-reduce only grows with them),
        data parallel or at a measured tensor-parallel degree; each option is its (dp, tp).
        With ``--tp K``, K-way from K devices on (``ForcedCurve``)."""
        key = (op, recompute)
        if key not in self._best_memo:
            k = self._forced(op)

            def options(tp: int, limit: int) -> list[tuple[int, float, tuple[int, int]]]:
                dps = shard_breakpoints(op.batch, limit)
                return [(dp * tp, self._time(op, dp, recompute, tp), (dp, tp)) for dp in dps]

            if k is None:
                degrees = (1, *self._measured_degrees(op))
                devices = self.cluster.devices
                curve: Any = StepCurve.of(p for t in degrees for p in options(t, devices // t))
            else:
                above = StepCurve.of(options(k, self.cluster.devices // k), least=k)
                curve = ForcedCurve(StepCurve.of(options(1, k - 1)), above, k)
            self._best_memo[key] = curve
        return self._best_memo[key]

    def _layout(self, op: MetaOp, n: int) -> tuple[int, int]:
        """(dp, tp) of an entry on n devices: the curve's tensor-parallel layout at n where it
        has one, else the data-parallel degree whose shard the runtime runs (it splits a batch
        over every device of an entry): the least dp with n's shard. With the fit monotone, no
        smaller dp is faster, so the time is ``_best``'s at n as well."""
        chosen = self._best(op).at(n)[1]
        if chosen[1] > 1:
            return chosen
        shard = comm.ceil_div(max(op.batch, 1), max(min(n, max(op.batch, 1)), 1))
        return comm.ceil_div(max(op.batch, 1), shard), 1

    def allocations(self, op: MetaOp, recompute: bool = False) -> tuple[int, ...]:
        """The allocations ``op``'s curve lists (``cost.allocations``)."""
        return listed(self._best(op, recompute), self.cluster)

    def curves(self, graph: MetaGraph, recompute: frozenset[str] = frozenset()) -> Curves:
        missing = [op for op in graph.metaops if self.profile.lookup(op) is None]
        if missing:
            raise self._missing(missing)
        return Curves(
            tuple(
                _scaled(
                    curve_of(op.id, self._best(op, op.id in recompute), self.cluster, _tp_only),
                    first_layer_saving(graph, op, self._entry(op).first_layer_ratio),
                )
                for op in graph.metaops
            ),
            source=self.source,
        )

    def memory_bytes(self, op: MetaOp, n: int, layers: int) -> int:
        return slice_memory_bytes(op, layers, *self._layout(op, n), self.cluster, n)

    def alone_bytes(
        self,
        graph: MetaGraph,
        op: MetaOp,
        first: int,
        end: int,
        recompute: bool = False,
        ns: Sequence[int] | None = None,
        zero_stage: int = 1,
        micro_batches: int = 1,
    ) -> tuple[int, ...]:
        recompute = recompute and op.needs_backward
        ns = self.allocations(op, recompute) if ns is None else ns
        configs = [(n, *self._layout(op, n)) for n in ns]
        info = self._info(graph, op)
        return alone_bytes(
            info, op, first, end, configs, recompute, self.cluster, zero_stage, micro_batches
        )

    def slice_memory(
        self,
        graph: MetaGraph,
        op: MetaOp,
        n: int,
        first: int,
        end: int,
        recompute: bool = False,
        zero_stage: int = 1,
        micro_batches: int = 1,
    ) -> SliceMemory:
        recompute = recompute and op.needs_backward
        dp, tp = (1, 1) if n == 1 else self._layout(op, n)
        info = self._info(graph, op)
        return slice_memory(
            info, op, first, end, dp, tp, recompute, self.cluster, zero_stage, micro_batches
        )
