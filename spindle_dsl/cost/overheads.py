"""The machine's figures for what a training step does besides the layers (``StepOverheads``).

Collectives and point-to-point exchange are alpha-beta lines in bytes, fitted per group size
(``Collective``); the optimizer is a line in the bytes of parameters a rank updates; input
stages and loss heads are lines in samples, keyed by their shape. ``spindle profile --nproc N``
measures all of it on the backend's own worker processes; ``analytic_overheads`` gives the
datasheet defaults, each an assumption stated where it is made. ``cost.step`` prices a step
with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost import comm
from spindle_dsl.cost.analytic import compute_seconds

GRAD_COLLECTIVES = ("reduce_scatter", "all_reduce")

# How the runtime reduces gradients: a property of the code, not of the machine, so it is set
# here (never read from a profile). Flip these when the runtime changes:
# - REDUCTION_OVERLAP: False = after the whole backward pass, blocking, bucket after bucket
#   (the runtime up to bucketed asynchronous reduction); True = each bucket launched as soon as
#   every part in it has finished its last backward on the rank, overlapping the rest of the
#   backward, and waited for before the optimizer step (the all-gather after the update is
#   never hidden).
# - BUCKET_BYTES: the most gradient bytes one bucket carries; overlap works at this
#   granularity. Today 2**22 fp32 elements (backends/torch/shards.py MAX_BUCKET_ELEMENTS).
# - MIN_BUCKET_BYTES: a bucket closes where the backward moves on to the next wave once it
#   holds this much (one collective per wave's parts, each paying the collective's latency);
#   smaller, it stays open for the next wave's parts. Today 2**16 fp32 elements (shards.py
#   MIN_BUCKET_ELEMENTS).
# - GRAD_COLLECTIVE: how ZeRO-1 sums a bucket: "reduce_scatter" (torch 2.13's gloo has it, so
#   the runtime's "auto" picks it) or "all_reduce" (the fallback keeping each holder's rows).
REDUCTION_OVERLAP = True
BUCKET_BYTES = float(2**22 * 4)
MIN_BUCKET_BYTES = float(2**16 * 4)
GRAD_COLLECTIVE = "reduce_scatter"


@dataclass(frozen=True)
class Line:
    """``seconds = alpha_s + beta_s * x`` for x > 0 (bytes or samples), 0 for nothing."""

    alpha_s: float
    beta_s: float

    def at(self, x: float) -> float:
        return self.alpha_s + self.beta_s * x if x > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"alpha_s": self.alpha_s, "beta_s": self.beta_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Line:
        return cls(float(d["alpha_s"]), float(d["beta_s"]))


@dataclass(frozen=True)
class Collective:
    """One collective's seconds over g ranks, a ``Line`` in the bytes of the whole buffer (the
    gradient reduced, scattered or gathered), fitted per group size. A size not measured is
    scaled from the nearest one as a ring scales: latency with the ``g - 1`` steps, volume
    with ``(g - 1) / g``."""

    fits: tuple[tuple[int, Line], ...]  # (group size >= 2, line), sizes increasing

    def seconds(self, nbytes: float, group: int) -> float:
        if group <= 1 or nbytes <= 0 or not self.fits:
            return 0.0
        g0, line = min(self.fits, key=lambda f: (abs(f[0] - group), -f[0]))
        if g0 == group:
            return line.at(nbytes)
        steps = (group - 1) / (g0 - 1)
        volume = ((group - 1) / group) / ((g0 - 1) / g0)
        return line.alpha_s * steps + line.beta_s * volume * nbytes

    def to_dict(self) -> dict[str, Any]:
        return {str(g): line.to_dict() for g, line in self.fits}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Collective:
        return cls(tuple(sorted((int(g), Line.from_dict(v)) for g, v in d.items())))

    @classmethod
    def ring(cls, bandwidth: float, latency: float, passes: int) -> Collective:
        """A ring collective of ``passes`` rounds of ``g - 1`` steps (all-reduce 2, reduce-
        scatter and all-gather 1) on a link of ``bandwidth`` bytes/s and ``latency`` s."""
        return cls(((2, Line(passes * latency, passes * 0.5 / bandwidth)),))


def part_class(key: str) -> str:
    """Parts that cost the optimizer alike: every layer of a module is one class
    (``lm/layer.3`` -> ``lm/layer``); input stages and heads are their own."""
    module, _, role = key.partition("/")
    return f"{module}/layer" if role.startswith("layer.") else key


@dataclass(frozen=True)
class StepOverheads:
    """The machine's figures for everything a step does besides the layers (see the module
    docstring). ``inputs`` and ``losses`` map a key (``input_key``, ``loss_key``) to seconds
    per sample, forward and backward; what they lack is priced from its FLOPs at
    ``seconds_per_flop``."""

    source: str  # "analytic" or the profile it was measured into
    all_reduce: Collective
    reduce_scatter: Collective
    all_gather: Collective
    p2p: Line  # one exchange phase: seconds for the bytes the busiest rank sends or receives
    optimizer: Line  # AdamW: seconds for the bytes of parameters one rank updates
    copy_s_per_byte: float  # flat-buffer copies per byte held, for parts not in ``parts``
    wave_s: float  # fixed seconds per stage (forward + backward) a rank runs
    seconds_per_flop: float  # fallback rate for input stages and losses not measured
    inputs: tuple[tuple[str, Line], ...] = ()
    losses: tuple[tuple[str, Line], ...] = ()
    # per part class (``part_class``): seconds of the optimizer's per-part work on a rank
    # holding it (gradients into the flat buffer, weights out again, tensor by tensor)
    parts: tuple[tuple[str, float], ...] = ()
    part_s: float = 0.0  # fixed seconds per part held, for parts not in ``parts``
    # per part class: the per-part work where a rank is the part's only holder: no flat buffer
    # and no copies (the part steps in place), but AdamW over each of its tensors, each with
    # its own cost beyond what the bytes take (a call over many tensors costs well over one
    # over a single tensor of the same bytes; ``spindle profile`` measures it per part class)
    parts_alone: tuple[tuple[str, float], ...] = ()
    cores: int | None = None  # cores of the machine it was measured on (None: not a CPU)
    # how much slower work runs, beyond its fair share, when more workers than cores take
    # turns on them (caches refilled after every switch): measured by ``spindle profile``
    # with more ranks than cores (a block of one layer's calls on all ranks at once against on
    # as many as the cores, each timed whole); 1.0 = the OS's fair share only (the analytic
    # assumption)
    sharing_slowdown: float = 1.0
    # how far one rank's stage time strays from another's running side by side, as a fraction
    # of the stage (a robust coefficient of variation of what the ranks do not share: a
    # machine slowing every core alike makes no rank wait for another); measured by ``spindle
    # profile`` from the layer points' turns; 0 = stages take exactly their expected time (the
    # analytic assumption). ``cost.step`` prices the expected wait where concurrent groups meet.
    rank_jitter: float = 0.0
    # how the runtime reduces gradients (the module constants above; tests vary them)
    grad_collective: str = GRAD_COLLECTIVE
    reduction_overlap: bool = REDUCTION_OVERLAP
    bucket_bytes: float = BUCKET_BYTES
    min_bucket_bytes: float = MIN_BUCKET_BYTES
    _inputs: dict[str, Line] = field(default_factory=dict, compare=False, repr=False)
    _losses: dict[str, Line] = field(default_factory=dict, compare=False, repr=False)
    _parts: dict[str, float] = field(default_factory=dict, compare=False, repr=False)
    _alone: dict[str, float] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        assert self.grad_collective in GRAD_COLLECTIVES, self.grad_collective
        self._inputs.update(self.inputs)
        self._losses.update(self.losses)
        self._parts.update(self.parts)
        self._alone.update(self.parts_alone)

    def part_seconds(self, key: str, nbytes: float) -> float:
        """The optimizer's per-part work for part ``key`` of ``nbytes`` on one of several
        holders."""
        got = self._parts.get(part_class(key))
        return got if got is not None else self.part_s + self.copy_s_per_byte * nbytes

    def part_alone_seconds(self, key: str, nbytes: float) -> float:
        """The same on the part's only holder (``parts_alone``). Where not measured: a profile
        that measured the part only as one of several holders' (no ``parts_alone`` entry for
        it) keeps that figure; otherwise the fixed ``part_s`` without the copies, which an only
        holder does not make."""
        cls = part_class(key)
        got = self._alone.get(cls)
        if got is not None:
            return got
        shared = self._parts.get(cls)
        return shared if shared is not None else self.part_s

    def part_least_seconds(self, key: str, nbytes: float) -> float:
        """The least per-part work a holder of ``key`` pays, however many hold it."""
        return min(self.part_seconds(key, nbytes), self.part_alone_seconds(key, nbytes))

    def part_replicated_seconds(self, key: str, nbytes: float) -> float:
        """The per-part work on one of several holders of a replicated part (ZeRO-0): AdamW
        over its own tensors, after laying its gradients into the all-reduced flat buffer (one
        copy; the gradients then view it, nothing is copied back)."""
        return self.part_alone_seconds(key, nbytes) + 0.5 * self.copy_s_per_byte * nbytes

    def part_shared_least_seconds(self, key: str, nbytes: float) -> float:
        """The least per-part work each of several holders of ``key`` pays, whatever the ZeRO
        stage (replicated, or sharded through flat buffers)."""
        return min(self.part_seconds(key, nbytes), self.part_replicated_seconds(key, nbytes))

    def input_line(self, key: str) -> Line | None:
        return self._inputs.get(key)

    def loss_line(self, key: str) -> Line | None:
        return self._losses.get(key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "all_reduce": self.all_reduce.to_dict(),
            "reduce_scatter": self.reduce_scatter.to_dict(),
            "all_gather": self.all_gather.to_dict(),
            "p2p": self.p2p.to_dict(),
            "optimizer": self.optimizer.to_dict(),
            "copy_s_per_byte": self.copy_s_per_byte,
            "wave_s": self.wave_s,
            "seconds_per_flop": self.seconds_per_flop,
            "inputs": {k: v.to_dict() for k, v in self.inputs},
            "losses": {k: v.to_dict() for k, v in self.losses},
            "parts": dict(self.parts),
            "part_s": self.part_s,
            "parts_alone": dict(self.parts_alone),
            "cores": self.cores,
            "sharing_slowdown": self.sharing_slowdown,
            "rank_jitter": self.rank_jitter,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str) -> StepOverheads:
        """Raises KeyError, TypeError or ValueError on a malformed dict (callers wrap them)."""
        cores = d.get("cores")
        return cls(
            source=source,
            all_reduce=Collective.from_dict(d["all_reduce"]),
            reduce_scatter=Collective.from_dict(d["reduce_scatter"]),
            all_gather=Collective.from_dict(d["all_gather"]),
            p2p=Line.from_dict(d["p2p"]),
            optimizer=Line.from_dict(d["optimizer"]),
            copy_s_per_byte=float(d["copy_s_per_byte"]),
            wave_s=float(d["wave_s"]),
            seconds_per_flop=float(d["seconds_per_flop"]),
            inputs=tuple((str(k), Line.from_dict(v)) for k, v in d.get("inputs", {}).items()),
            losses=tuple((str(k), Line.from_dict(v)) for k, v in d.get("losses", {}).items()),
            parts=tuple((str(k), float(v)) for k, v in d.get("parts", {}).items()),
            part_s=float(d.get("part_s", 0.0)),
            parts_alone=tuple((str(k), float(v)) for k, v in d.get("parts_alone", {}).items()),
            cores=None if cores is None else int(cores),
            sharing_slowdown=float(d.get("sharing_slowdown", 1.0)),
            rank_jitter=float(d.get("rank_jitter", 0.0)),
        )


# Analytic defaults (assumptions, to be replaced by `spindle profile --nproc N`):
# - the optimizer: PyTorch's per-tensor AdamW reads weight, gradient, m and v and writes
#   weight, m and v: 7 passes over the parameter bytes, at ~5 GB/s of effective memory
#   bandwidth for one CPU core and ~1.5 TB/s for a GPU's HBM, plus a call's dispatch;
# - copies into and out of the flat reduction buffers: 2 passes per held byte;
# - a stage's fixed cost: ~0.1 ms of Python and autograd dispatch on a CPU, 20 us on a GPU.
CPU_MEMORY_BANDWIDTH = 5e9
GPU_MEMORY_BANDWIDTH = 1.5e12
CPU_WAVE_S = 1e-4
GPU_WAVE_S = 2e-5
# - the optimizer's work per part besides its bytes: a dozen tensors, a few small copies each
#   (~0.1 ms of dispatch on a CPU; kernel launches on a GPU cost about twice that); an only
#   holder makes no copies, so it pays the fixed part alone (``part_alone_seconds``).
CPU_PART_S = 1e-4
GPU_PART_S = 2e-4
OPTIMIZER_CALL_S = 1e-4


def analytic_overheads(cluster: Cluster) -> StepOverheads:
    """The step's figures from the cluster's datasheet numbers (see the assumptions above)."""
    cpu = comm.is_cpu(cluster)
    bandwidth, latency = comm.link(cluster, crosses_nodes=False)
    memory = CPU_MEMORY_BANDWIDTH if cpu else GPU_MEMORY_BANDWIDTH
    flops = 1e12  # 1 TFLOP of a large layer, to read the efficiency-corrected rate off
    return StepOverheads(
        source="analytic",
        all_reduce=Collective.ring(bandwidth, latency, 2),
        reduce_scatter=Collective.ring(bandwidth, latency, 1),
        all_gather=Collective.ring(bandwidth, latency, 1),
        p2p=Line(latency, 1.0 / bandwidth),
        optimizer=Line(OPTIMIZER_CALL_S, 7.0 / memory),
        copy_s_per_byte=2.0 / memory,
        part_s=CPU_PART_S if cpu else GPU_PART_S,
        wave_s=CPU_WAVE_S if cpu else GPU_WAVE_S,
        seconds_per_flop=compute_seconds(flops, cluster) / flops,
        cores=None,
    )
