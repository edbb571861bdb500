"""The backend interface: what any executor of a wave plan takes and gives back.

A backend turns (MetaGraph, Plan, RunConfig) into real training steps. The values crossing this
boundary are frozen dataclasses so that the CLI, the notebooks and the benchmarks drive every
backend the same way and can print, compare and pickle what they get (``--nproc`` pickles the
job to its worker processes). Backends register by name so that ``spindle train --backend``
needs no import of a backend it does not use.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan
from spindle_dsl.recipe import LR_DECAYS, LrDecay, lr_at

DType = Literal["float32", "float64", "bfloat16"]
DeviceKind = Literal["auto", "cpu", "cuda"]
RecomputeMode = Literal["all", "plan", "none"]
GradCollective = Literal["auto", "all_reduce", "reduce_scatter"]


@dataclass(frozen=True)
class RunConfig:
    """How to train: everything that is not the model (the spec) or the schedule (the plan)."""

    steps: int = 10  # optimizer steps to run (in total, counting those a resume skips)
    seed: int = 0  # seeds parameter initialisation and the synthetic data
    lr: float = 1e-3  # AdamW's peak learning rate (``spindle_dsl.recipe`` has the schedule)
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0  # linear warmup: step n <= W trains at lr * n / W
    lr_decay: LrDecay = "constant"  # after the warmup: constant, or linear / cosine to min_lr
    min_lr: float = 0.0  # the rate of the last step under linear or cosine decay
    clip_grad: float = 0.0  # clip the global gradient norm to this (0: no clipping)
    # (module, factor): a module's rate (and so its weight decay) is the schedule's times it
    lr_scales: tuple[tuple[str, float], ...] = ()
    eval_every: int = 0  # evaluate the held-out data every K steps (0: after the last only)
    eval_batches: int = 1  # held-out batches per evaluation (each of the task's batch size)
    keep_checkpoints: int = 0  # keep the newest N complete checkpoints (0: every one)
    # training dtype; float64 makes runs comparable to 1e-9; bfloat16 is mixed precision: bf16
    # weights, activations and gradients, fp32 master weights and AdamW state (sharded optimizer)
    dtype: DType = "float32"
    device: DeviceKind = "auto"  # auto: CUDA with NCCL where there is a GPU, else CPU with gloo
    checkpoint_dir: str | None = None  # where checkpoints go (and resume from)
    checkpoint_every: int = 0  # also checkpoint every K steps (0: only at the end)
    resume: bool = True  # continue from the newest checkpoint in checkpoint_dir if there is one
    log_json: str | None = None  # one JSON object per line and step: step, loss per task, seconds
    tensorboard: str | None = None  # a TensorBoard event folder for the same figures
    trace: str | None = None  # measured Chrome trace (same format as the predicted one)
    progress: bool = True  # a progress line on rank 0
    hang_timeout_s: float = 45.0  # a rank without progress for this long counts as hung
    collective_timeout_s: float = 50.0  # torch.distributed timeout inside the workers
    step_delay_s: float = 0.0  # sleep after each step (tests use it to kill a worker mid-run)
    # activation recompute: "plan" for the MetaOps the plan marks, "all" or "none" to override
    recompute: RecomputeMode = "plan"
    # ZeRO-1: shard each part's AdamW state over its holders (False: every holder keeps it all)
    optimizer_sharding: bool = True
    # how sharded gradients are summed: reduce-scatter where the backend has it ("auto"), or an
    # all-reduce of which each holder keeps its shard (benchmarks and tests pick one)
    grad_collective: GradCollective = "auto"
    # micro-batch passes per step (gradient accumulation, one optimizer step): None runs the
    # plan's micro_batches
    micro_batches: int | None = None
    # ZeRO stage: 0 shards nothing, 1 each part's AdamW state over its holders, 2 its gradients
    # too; None runs the plan's zero_stage (optimizer_sharding=False means 0 whatever it says)
    zero_stage: int | None = None
    # measure each rank's peak tensor bytes (``backends/torch/memory.py``)
    measure_memory: bool = True
    # the most gradient elements one bucket carries (None: the runtime's own cap, which the
    # step model prices; ``backends/torch/shards.MAX_BUCKET_ELEMENTS``): smaller buckets start
    # reducing earlier in a stage's backward, each paying a collective's latency (tests and
    # benchmarks pick one)
    bucket_elements: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.steps < 0:
            problems.append(f"steps must be at least 0, got {self.steps}")
        if self.checkpoint_every < 0:
            problems.append(f"checkpoint_every must be at least 0, got {self.checkpoint_every}")
        if self.lr <= 0:
            problems.append(f"lr must be positive, got {self.lr}")
        problems += self._recipe_problems()
        if self.dtype not in ("float32", "float64", "bfloat16"):
            problems.append(f"dtype must be float32, float64 or bfloat16, got {self.dtype!r}")
        elif self.dtype == "bfloat16" and not self.optimizer_sharding:
            problems.append(
                "bfloat16 training keeps fp32 master weights in the sharded optimizer; "
                "turn optimizer sharding on, or train in float32"
            )
        if self.device not in ("auto", "cpu", "cuda"):
            problems.append(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.recompute not in ("all", "plan", "none"):
            problems.append(f"recompute must be all, plan or none, got {self.recompute!r}")
        if self.grad_collective not in ("auto", "all_reduce", "reduce_scatter"):
            problems.append(
                f"grad_collective must be auto, all_reduce or reduce_scatter, "
                f"got {self.grad_collective!r}"
            )
        if self.bucket_elements is not None and self.bucket_elements < 1:
            problems.append(f"bucket_elements must be at least 1, got {self.bucket_elements}")
        if self.micro_batches is not None and self.micro_batches < 1:
            problems.append(f"micro_batches must be at least 1, got {self.micro_batches}")
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2):
            problems.append(f"zero_stage must be 0, 1 or 2, got {self.zero_stage}")
        elif self.zero_stage and not self.optimizer_sharding:
            problems.append(
                f"zero_stage {self.zero_stage} (--zero-stage) shards the optimizer, but optimizer "
                f"sharding is off (--optimizer-sharding off); drop one of the two"
            )
        elif self.zero_stage == 0 and self.dtype == "bfloat16":
            problems.append(
                "bfloat16 training keeps fp32 master weights in the sharded optimizer; "
                "use zero_stage 1 or 2, or train in float32"
            )
        if self.hang_timeout_s <= 0 or self.collective_timeout_s <= 0:
            problems.append("timeouts must be positive")
        if problems:
            raise ExecutionError("; ".join(problems))

    def _recipe_problems(self) -> list[str]:
        """What is wrong with the schedule, clipping, evaluation and checkpoint settings (the
        spec's train block has checked them already where a spec gave them)."""
        problems = []
        if self.lr_decay not in LR_DECAYS:
            problems.append(
                f"lr_decay must be one of {', '.join(LR_DECAYS)}, got {self.lr_decay!r}"
            )
        if not 0 <= self.warmup_steps <= max(self.steps, 0):
            problems.append(
                f"warmup_steps must be within 0..steps ({self.steps}), got {self.warmup_steps}"
            )
        if not 0 <= self.min_lr <= self.lr:
            problems.append(f"min_lr must be within 0..lr ({self.lr}), got {self.min_lr}")
        if self.clip_grad < 0:
            problems.append(f"clip_grad must not be negative, got {self.clip_grad}")
        if any(scale <= 0 for _, scale in self.lr_scales):
            problems.append(f"every lr_scale must be positive, got {dict(self.lr_scales)}")
        for name in ("eval_every", "keep_checkpoints"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be at least 0, got {getattr(self, name)}")
        if self.eval_batches < 1:
            problems.append(f"eval_batches must be at least 1, got {self.eval_batches}")
        return problems

    def lr_at(self, step: int) -> float:
        """The base learning rate of 0-based step ``step`` (``recipe.lr_at``)."""
        return lr_at(
            step,
            lr=self.lr,
            steps=self.steps,
            warmup_steps=self.warmup_steps,
            decay=self.lr_decay,
            min_lr=self.min_lr,
        )


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as rank 0 saw it: the loss of every task and the wall time."""

    step: int  # 1-based: the number of optimizer steps taken when it ends
    losses: tuple[tuple[str, float], ...]  # (task, mean loss of its batch), declaration order
    seconds: float
    mix: str | None = None  # the mix this step trained (a schedule changes it)
    # On the first step of a schedule's phase: the seconds the run took to switch to the
    # phase's plan (before the step, not counted in ``seconds``).
    switch_s: float | None = None
    lr: float | None = None  # the base learning rate the step trained at
    grad_norm: float | None = None  # the global gradient norm, before clipping
    samples: int = 0  # samples the step trained (every task's batch)
    tokens: int = 0  # input tokens of those samples (every modality a task reads)
    flops: float = 0.0  # the graph's FLOPs per iteration, as the cost model counts them
    peak_flops: float = 0.0  # the devices' peak FLOP/s, all ranks together (cluster preset)
    # (task, mean held-out loss) after the step, where the run evaluated
    eval_losses: tuple[tuple[str, float], ...] | None = None

    def loss(self, task: str) -> float:
        return dict(self.losses)[task]

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: the graph's FLOPs per second over the devices' peak."""
        if self.seconds <= 0 or self.peak_flops <= 0 or self.flops <= 0:
            return None
        return self.flops / self.seconds / self.peak_flops

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "mix": self.mix, "loss": dict(self.losses)}
        if self.eval_losses is not None:
            out["eval_loss"] = dict(self.eval_losses)
        if self.lr is not None:
            out["lr"] = self.lr
        if self.grad_norm is not None:
            out["grad_norm"] = self.grad_norm
        out["seconds"] = self.seconds
        if self.seconds > 0 and self.samples:
            out["tokens_per_s"] = self.tokens / self.seconds
            out["samples_per_s"] = self.samples / self.seconds
        if self.mfu is not None:
            out["mfu"] = self.mfu
        if self.switch_s is not None:
            out["switch_s"] = self.switch_s
        return out


@dataclass(frozen=True)
class RunResult:
    """What a finished run reports back."""

    steps: tuple[StepRecord, ...]  # the steps this run executed (after any resume)
    world_size: int
    backend: str  # "gloo" or "nccl"
    resumed_from: int  # step of the checkpoint the run started from, 0 if none
    predicted_step_s: float  # the plan's iteration_s
    checkpoint: str | None = None  # the last checkpoint written
    trace: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def measured_step_s(self) -> float:
        """Median step time, leaving out the first step (it pays for warm-up) when there are
        more; the median resists the odd step that a busy machine slows down."""
        times = sorted(s.seconds for s in (self.steps[1:] if len(self.steps) > 1 else self.steps))
        if not times:
            return float("nan")
        mid = len(times) // 2
        return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2


class Backend(ABC):
    """Runs a plan. Implementations keep whatever processes and devices they need private."""

    name: str

    @abstractmethod
    def train(
        self,
        graph: MetaGraph,
        plan: Plan,
        config: RunConfig,
        *,
        nproc: int | None = None,
        datasets: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Train ``config.steps`` steps of ``graph`` on the schedule ``plan``.

        ``nproc`` spawns that many local worker processes; None runs this process as one rank
        of a job started by a launcher (``torchrun``), or as the only rank. ``datasets`` binds a
        dataset to a task by name (otherwise it reads the deterministic synthetic source).
        """


_BACKENDS = {"torch": "spindle_dsl.backends.torch:TorchBackend"}


def get_backend(name: str = "torch") -> Backend:
    """The backend called ``name``, imported on first use."""
    try:
        target = _BACKENDS[name]
    except KeyError:
        known = ", ".join(sorted(_BACKENDS))
        raise ExecutionError(f"unknown backend '{name}' (known: {known})") from None
    module_name, cls_name = target.split(":")
    return getattr(importlib.import_module(module_name), cls_name)()
