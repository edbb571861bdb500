"""The wave plan as values, and its JSON form (``shared/docs/plan-format.md``, version 2).

A plan is what every later stage reads: the renderer draws it, the runtime executes it, users
diff it. It is self-contained (the MetaOps carry their curves) so that a plan file can be
validated, drawn and compared without the spec; the runtime still needs the spec for the model.
Fields beyond the required ones are documented where they are declared.

Optional per-MetaOp field ``"recompute": true`` (written only when true, read back as false
when absent): the MetaOp runs with activation recompute (full per-layer checkpointing), which
the planner turns on when the plan would not fit in device memory otherwise. The runtime keeps
only each layer's input from the forward pass and runs the layer's forward again inside its
backward (``torch.utils.checkpoint`` per layer); ``seconds_per_layer`` of such a MetaOp is
already its curve with that extra forward, and the plan's ``notes`` say why it was chosen.

Per-MetaOp ``"layout_per_layer"`` (version 2): ``{n: [dp, tp]}``, the layout each point of
``seconds_per_layer`` is priced with and the runtime runs on ``n`` devices: ``dp``
data-parallel replicas of ``tp``-way tensor-parallel layers, ``dp * tp <= n`` (the rest idle).
A point it does not list, and every point of a version 1 file, is ``[n, 1]``: data parallel
over all ``n`` devices.

Top-level ``"micro_batches"`` (k, always written; read as 1 when absent) and
``"zero_stage"`` (1 when absent: each parameter part's optimizer state is sharded over the
devices that hold the part; 2: its gradients are sharded too, ZeRO-2; 0: nothing sharded) are
the memory levers the runtime carries out as the plan says.

Optional top-level ``"loss_devices"`` (absent: none): ``{sink MetaOp id: [device, ...]}`` for
lm sinks whose loss the runtime computes on those devices instead of the sink's last entry's.
The sink's output rows (the positions the head reads) are re-split over the listed devices in
their order, as a flow between entries is, and their gradients come back; every listed device
holds the LM head. The planner spreads a loss so when that makes the step quicker
(``planner.evaluate.relabel``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spindle_dsl.atomic import write_atomic
from spindle_dsl.errors import PlanFormatError

if TYPE_CHECKING:
    from spindle_dsl.cluster import Cluster
    from spindle_dsl.metagraph import MetaOp

FORMAT = "spindle-plan"
VERSION = 2
READABLE_VERSIONS = (1, 2)  # a version 1 file loads with every layout data parallel

# What each term of ``Plan.gap_split`` stands for (a breakdown term less what the bound counts
# for it), in words for the summary, the report and the bench
GAP_TERMS = {
    "compute_s": "compute over the LP",
    "transfer_s": "activation transfers",
    "grad_sync_s": "gradient sync past the closing all-reduce",
    "wave_overhead_s": "wave overheads",
    "loss_s": "loss phase over its floor",
    "optimizer_s": "optimizer over its floor",
    "bound_s": "bound beyond the LP and floors",
    "other_s": "iteration beyond its breakdown",
}


@dataclass(frozen=True)
class SpecRef:
    path: str
    sha256: str
    mix: str | None


@dataclass(frozen=True)
class ClusterRef:
    devices: int
    device: str
    devices_per_node: int
    memory_bytes: int

    @classmethod
    def of(cls, cluster: Cluster) -> ClusterRef:
        return cls(
            cluster.devices,
            cluster.device.name,
            cluster.devices_per_node,
            cluster.device.memory_bytes,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "device": self.device,
            "devices_per_node": self.devices_per_node,
            "memory_bytes": self.memory_bytes,
        }


@dataclass(frozen=True)
class PlanMetaOp:
    """A MetaOp as the plan records it, with its curve T_m(n) (seconds per layer)."""

    id: str
    task: str
    module: str
    kind: str
    layers: int
    batch: int
    tokens: int
    deps: tuple[str, ...]
    forward_flops_per_layer: float
    param_bytes_per_layer: int
    seconds_per_layer: tuple[tuple[int, float], ...]  # (n, T_m(n)), n increasing
    recompute: bool = False  # recompute activations in backward (see the module docstring)
    # (n, (dp, tp)) for the points that are not plain data parallel over n (module docstring)
    layout_per_layer: tuple[tuple[int, tuple[int, int]], ...] = ()

    def seconds_at(self, n: int) -> float:
        return dict(self.seconds_per_layer)[n]

    def layout_at(self, n: int) -> tuple[int, int]:
        """(dp, tp) of an entry on ``n`` devices: ``(n, 1)`` where the plan lists none."""
        return dict(self.layout_per_layer).get(n, (n, 1))

    @classmethod
    def of(
        cls,
        op: MetaOp,
        seconds_per_layer: tuple[tuple[int, float], ...],
        *,
        recompute: bool = False,
        layouts: tuple[tuple[int, tuple[int, int]], ...] = (),
    ) -> PlanMetaOp:
        """The record of a MetaGraph's MetaOp with its curve (the only fields a plan keeps)
        and the layouts behind it (only those that are not plain data parallel are kept)."""
        return cls(
            id=op.id,
            task=op.task,
            module=op.module,
            kind=op.kind,
            layers=op.layers,
            batch=op.batch,
            tokens=op.tokens,
            deps=op.deps,
            forward_flops_per_layer=op.forward_flops_per_layer,
            param_bytes_per_layer=op.param_bytes_per_layer,
            seconds_per_layer=seconds_per_layer,
            recompute=recompute,
            layout_per_layer=tuple((n, lay) for n, lay in layouts if lay != (n, 1)),
        )

    def to_dict(self) -> dict[str, Any]:
        """One entry of the plan file's ``metaops`` array."""
        return {
            "id": self.id,
            "task": self.task,
            "module": self.module,
            "kind": self.kind,
            "layers": self.layers,
            "batch": self.batch,
            "tokens": self.tokens,
            "deps": list(self.deps),
            "forward_flops_per_layer": self.forward_flops_per_layer,
            "param_bytes_per_layer": self.param_bytes_per_layer,
            "seconds_per_layer": {str(n): s for n, s in self.seconds_per_layer},
            **({"recompute": True} if self.recompute else {}),
            **(
                {"layout_per_layer": {str(n): list(lay) for n, lay in self.layout_per_layer}}
                if self.layout_per_layer
                else {}
            ),
        }


@dataclass(frozen=True)
class Entry:
    """Layers ``[first, end)`` of one MetaOp on ``devices`` inside one wave."""

    metaop: str
    first: int
    end: int
    devices: tuple[int, ...]
    time_s: float


@dataclass(frozen=True)
class Wave:
    index: int
    start_s: float
    duration_s: float
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class SolverInfo:
    name: str  # the scheduler that made the plan: "milp", "paper", "sequential", ...
    status: str  # "optimal", "feasible", "heuristic", ...
    wall_s: float  # planning time
    gap: float | None = None  # relative MIP gap where a solver reports one


@dataclass(frozen=True)
class Plan:
    spec: SpecRef
    cluster: ClusterRef
    metaops: tuple[PlanMetaOp, ...]
    waves: tuple[Wave, ...]
    iteration_s: float
    lower_bound_s: float
    baselines: tuple[tuple[str, float], ...]  # ("sequential_s", seconds), ...
    solver: SolverInfo
    # Optional fields (written under these names when present):
    breakdown: tuple[tuple[str, float], ...] = ()  # "compute_s", "transfer_s", "grad_sync_s"...
    memory_bytes: tuple[int, ...] = ()  # predicted peak bytes per device id
    notes: tuple[str, ...] = ()  # why a choice was made, e.g. why iteration_s > sequential_s
    # Memory levers the runtime carries out as planned (plan-format.md). ``micro_batches``: the
    # waves run k times per iteration, each on 1/k of every task's batch, gradients
    # accumulating, one optimizer step at the end (the waves and curves describe one pass).
    # ``zero_stage``: 1 shards each parameter part's optimizer state over the devices holding
    # the part (ZeRO-1, Megatron's distributed optimizer); 2 shards its gradients too (ZeRO-2).
    micro_batches: int = 1
    zero_stage: int = 1
    # lm sinks whose loss runs on other devices than their last entry's (module docstring)
    loss_devices: tuple[tuple[str, tuple[int, ...]], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def metaop(self, metaop_id: str) -> PlanMetaOp:
        return next(m for m in self.metaops if m.id == metaop_id)

    def baseline(self, name: str) -> float:
        return dict(self.baselines)[name]

    def compute_s(self) -> float:
        """The waves' time over every micro-batch pass (the iteration's compute)."""
        return self.micro_batches * sum(w.duration_s for w in self.waves)

    def busy_s(self) -> float:
        """Device-seconds the entries run over every pass, over the devices (or the cores
        they share, ``lanes``): the compute the waves would take if no device sat idle inside
        one. Set against the LP bound, which has no waves, it says how much of the compute
        over the bound the allocations cost (their device-seconds) and how much the waves'
        barriers (``idle_share``)."""
        work = sum(len(e.devices) * e.time_s for w in self.waves for e in w.entries)
        return self.micro_batches * work / self.lanes()

    def layout_of(self, entry: Entry) -> tuple[int, int]:
        """(dp, tp) the runtime runs ``entry`` with (``PlanMetaOp.layout_at``)."""
        return self.metaop(entry.metaop).layout_at(len(entry.devices))

    def layout_text(self, entry: Entry) -> str:
        """``"dp x tp"`` for a tensor-parallel entry, else empty."""
        dp, tp = self.layout_of(entry)
        return f"{dp}x{tp}" if tp > 1 else ""

    def lanes(self) -> int:
        """How many devices' work the cluster advances at once: its devices, or, where CPU
        workers share fewer cores, those cores (``extra["bounds"]["lanes"]``, from the step
        model the plan was priced with: a device waiting for a core is not idle)."""
        return (self.extra.get("bounds") or {}).get("lanes") or self.cluster.devices

    def idle_share(self) -> float:
        """The share of the devices' time in the waves (of the cores', where they share
        fewer, ``lanes``) that they sit idle inside a wave."""
        compute = self.compute_s()
        return 1.0 - self.busy_s() / compute if compute > 0 else 0.0

    def over_lp(self) -> tuple[float, float] | None:
        """``compute_s`` and ``busy_s`` each over the LP bound (``extra["bounds"]["lp_s"]``):
        how far the waves are above it, and how much of that the entries' device-seconds
        alone are; None for a plan without an LP figure or without waves."""
        lp = (self.extra.get("bounds") or {}).get("lp_s")
        if not lp or not self.waves:
            return None
        return self.compute_s() / lp, self.busy_s() / lp

    def gap_split(self) -> tuple[tuple[str, float], ...] | None:
        """Where the iteration's gap to the lower bound goes, term by term (``GAP_TERMS``):
        each term of ``breakdown`` less what the bound counts for it (the LP at the k that
        sets the bound for the compute, the step floors there for the loss phase, the
        optimizer and the closing all-reduce, which ``grad_sync_s`` holds), and, as a
        negative term, what the bound holds beyond the LP and those floors (the LP weighing
        the optimizer's per-part work). The terms sum to ``iteration_s - lower_bound_s``, so a
        user sees which of them a better plan would have to shrink. None for a plan whose
        bound does not record its floors (no ``floors`` under ``extra["bounds"]``) or without a
        breakdown."""
        bounds = self.extra.get("bounds") or {}
        floors = bounds.get("floors")
        if not floors or not self.breakdown:
            return None
        step_floors = bounds.get("step_floor_s", 0.0)
        counted = {
            "compute_s": self.lower_bound_s - step_floors,  # the LP at the bound's k
            "loss_s": floors.get("loss_s", 0.0),
            "optimizer_s": floors.get("optimizer_s", 0.0),
            "grad_sync_s": floors.get("closing_s", 0.0),
        }
        out = [(key, secs - counted.get(key, 0.0)) for key, secs in self.breakdown]
        floor_terms = counted["loss_s"] + counted["optimizer_s"] + counted["grad_sync_s"]
        out.append(("bound_s", floor_terms - step_floors))
        unpriced = self.iteration_s - sum(secs for _, secs in self.breakdown)
        if abs(unpriced) > 1e-12 * max(self.iteration_s, 1.0):
            out.append(("other_s", unpriced))
        return tuple(out)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, Any]:
        """Jupyter shows the plan as its timeline (``spindle_dsl.render.jupyter``)."""
        from spindle_dsl.render.jupyter import plan_mimebundle

        return plan_mimebundle(self, include, exclude)

    # --- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "spec": {"path": self.spec.path, "sha256": self.spec.sha256, "mix": self.spec.mix},
            "cluster": self.cluster.to_dict(),
            "metaops": [m.to_dict() for m in self.metaops],
            "waves": [
                {
                    "index": w.index,
                    "start_s": w.start_s,
                    "duration_s": w.duration_s,
                    "entries": [
                        {
                            "metaop": e.metaop,
                            "layers": [e.first, e.end],
                            "devices": list(e.devices),
                            "time_s": e.time_s,
                        }
                        for e in w.entries
                    ],
                }
                for w in self.waves
            ],
            "iteration_s": self.iteration_s,
            "lower_bound_s": self.lower_bound_s,
            "baselines": dict(self.baselines),
            "solver": {
                "name": self.solver.name,
                "status": self.solver.status,
                "wall_s": self.solver.wall_s,
                **({"gap": self.solver.gap} if self.solver.gap is not None else {}),
            },
        }
        out["micro_batches"] = self.micro_batches
        out["zero_stage"] = self.zero_stage
        if self.breakdown:
            out["breakdown"] = dict(self.breakdown)
        if self.memory_bytes:
            out["memory_bytes"] = list(self.memory_bytes)
        if self.loss_devices:
            out["loss_devices"] = {sink: list(ds) for sink, ds in self.loss_devices}
        if self.notes:
            out["notes"] = list(self.notes)
        out.update(self.extra)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a temporary file in the same folder, then a rename."""
        write_atomic(Path(path), self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """The plan a ``to_dict`` dictionary holds; keys it does not know are kept in
        ``extra``. Anything malformed raises ``PlanFormatError`` (the first problem found, in
        the order of the fields)."""
        try:
            if d.get("format") != FORMAT or d.get("version") not in READABLE_VERSIONS:
                raise PlanFormatError(
                    f"not a {FORMAT} version {' or '.join(map(str, READABLE_VERSIONS))} file "
                    f"(format={d.get('format')!r}, version={d.get('version')!r})"
                )
            return cls(
                spec=SpecRef(d["spec"]["path"], d["spec"]["sha256"], d["spec"]["mix"]),
                cluster=_cluster_from_dict(d["cluster"]),
                metaops=tuple(_metaop_from_dict(m) for m in d["metaops"]),
                waves=tuple(_wave_from_dict(w) for w in d["waves"]),
                iteration_s=float(d["iteration_s"]),
                lower_bound_s=float(d["lower_bound_s"]),
                baselines=tuple((k, float(v)) for k, v in d["baselines"].items()),
                solver=_solver_from_dict(d["solver"]),
                breakdown=tuple((k, float(v)) for k, v in d.get("breakdown", {}).items()),
                memory_bytes=tuple(int(x) for x in d.get("memory_bytes", ())),
                notes=tuple(d.get("notes", ())),
                micro_batches=_count(d.get("micro_batches", 1), "micro_batches", 1),
                zero_stage=_count(d.get("zero_stage", 1), "zero_stage", 0, 2),
                loss_devices=_loss_devices(d.get("loss_devices", {})),
                extra={k: v for k, v in d.items() if k not in _KNOWN_KEYS},
            )
        except PlanFormatError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise PlanFormatError(f"malformed plan: {type(exc).__name__}: {exc}") from None

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Plan:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise PlanFormatError(f"{path}: cannot read plan: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            where = f"{path}:{exc.lineno}:{exc.colno}"
            raise PlanFormatError(f"{where}: invalid JSON: {exc.msg}") from None
        if not isinstance(data, dict):
            raise PlanFormatError(f"{path}: a plan is a JSON object")
        return cls.from_dict(data)


# the top-level keys ``Plan.from_dict`` reads; any others are kept in ``Plan.extra``
_KNOWN_KEYS = {
    "format",
    "version",
    "spec",
    "cluster",
    "metaops",
    "waves",
    "iteration_s",
    "lower_bound_s",
    "baselines",
    "solver",
    "breakdown",
    "memory_bytes",
    "notes",
    "micro_batches",
    "zero_stage",
    "loss_devices",
}


def _cluster_from_dict(c: dict[str, Any]) -> ClusterRef:
    """A plan's ``cluster`` object."""
    return ClusterRef(
        int(c["devices"]),
        str(c["device"]),
        int(c["devices_per_node"]),
        int(c["memory_bytes"]),
    )


def _metaop_from_dict(m: dict[str, Any]) -> PlanMetaOp:
    """One of a plan's ``metaops`` (its per-width layer times sorted by width)."""
    return PlanMetaOp(
        id=m["id"],
        task=m["task"],
        module=m["module"],
        kind=m["kind"],
        layers=int(m["layers"]),
        batch=int(m["batch"]),
        tokens=int(m["tokens"]),
        deps=tuple(m["deps"]),
        forward_flops_per_layer=float(m["forward_flops_per_layer"]),
        param_bytes_per_layer=int(m["param_bytes_per_layer"]),
        seconds_per_layer=tuple(
            sorted((int(n), float(s)) for n, s in m["seconds_per_layer"].items())
        ),
        recompute=_flag(m.get("recompute", False), f"metaop {m['id']} recompute"),
        layout_per_layer=_layouts(m.get("layout_per_layer", {}), m["id"]),
    )


def _layouts(d: dict[str, Any], metaop: str) -> tuple[tuple[int, tuple[int, int]], ...]:
    """A MetaOp's ``layout_per_layer``: ``{n: [dp, tp]}`` with ``dp, tp >= 1`` and
    ``dp * tp <= n``; plain data parallel points are dropped (they are the default)."""
    out = []
    for n_text, pair in sorted(d.items(), key=lambda item: int(item[0])):
        n = int(n_text)
        dp, tp = (int(pair[0]), int(pair[1])) if len(pair) == 2 else (0, 0)
        if dp < 1 or tp < 1 or dp * tp > n:
            raise PlanFormatError(
                f"metaop {metaop}: layout_per_layer[{n_text}] = {pair!r} is not [dp, tp] with "
                f"dp, tp >= 1 and dp * tp <= {n}"
            )
        if (dp, tp) != (n, 1):
            out.append((n, (dp, tp)))
    return tuple(out)


def _wave_from_dict(w: dict[str, Any]) -> Wave:
    """One of a plan's ``waves``, with its entries (``layers`` as ``[first, end]``)."""
    return Wave(
        index=int(w["index"]),
        start_s=float(w["start_s"]),
        duration_s=float(w["duration_s"]),
        entries=tuple(
            Entry(
                metaop=e["metaop"],
                first=int(e["layers"][0]),
                end=int(e["layers"][1]),
                devices=tuple(int(x) for x in e["devices"]),
                time_s=float(e["time_s"]),
            )
            for e in w["entries"]
        ),
    )


def _solver_from_dict(s: dict[str, Any]) -> SolverInfo:
    """A plan's ``solver`` object (``gap`` optional)."""
    return SolverInfo(s["name"], s["status"], float(s["wall_s"]), s.get("gap"))


def _flag(value: Any, what: str) -> bool:
    """A JSON boolean; anything else is a malformed plan (``"false"`` is not false)."""
    if not isinstance(value, bool):
        raise PlanFormatError(f"malformed plan: {what} must be true or false, got {value!r}")
    return value


def _count(value: Any, what: str, low: int, high: int | None = None) -> int:
    """A JSON integer within ``[low, high]``; anything else is a malformed plan."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanFormatError(f"malformed plan: {what} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        span = f"at least {low}" if high is None else f"from {low} to {high}"
        raise PlanFormatError(f"malformed plan: {what} must be {span}, got {value}")
    return value


def _loss_devices(value: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``{sink: [device, ...]}``: non-empty lists of distinct device ids; anything else is a
    malformed plan (whether the sinks and devices fit the spec is the runtime's check)."""
    if not isinstance(value, dict):
        raise PlanFormatError(f"malformed plan: loss_devices must be an object, got {value!r}")
    out = []
    for sink, devices in value.items():
        if not isinstance(devices, list) or not devices:
            raise PlanFormatError(
                f"malformed plan: loss_devices[{sink!r}] must be a non-empty list of devices"
            )
        ids = tuple(_count(x, f"loss_devices[{sink!r}] device", 0) for x in devices)
        if len(set(ids)) != len(ids):
            raise PlanFormatError(f"malformed plan: loss_devices[{sink!r}] repeats a device")
        out.append((str(sink), ids))
    return tuple(out)
