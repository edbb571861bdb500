"""The optimizers a rank can step: AdamW replicated on every holder, or sharded (``zero.py``).

AdamW updates each parameter from that parameter's own gradient and state alone, so a rank that
holds a subset of the parameters, given the same summed gradients, computes exactly the
single-process update for them. Every holder, the oracle and a resumed run use the same
implementation, torch's fused AdamW (``fused=True``): one pass over each tensor instead of a
dozen elementwise kernels, so on one CPU thread it steps several times quicker than the
per-tensor loop or the multi-tensor (foreach) one; it rounds differently from the per-tensor
loop (one ulp here and there), so the oracle uses it too, and its update is elementwise, so a
shard steps exactly as the same elements of the whole tensor would. Both optimizers answer the
same calls (``RankOptimizer``), so the trainer and the checkpoints need not know which one
runs.

Each step takes the schedule's learning rate (``recipe.lr_at``), times a module's ``lr_scale``
for its parts, and reports the squared gradient norm of the parts it owns (the first holder's
for a replicated part, each holder's shard for a sharded one), so the parts' squares add up
over the ranks to the global norm's square with every parameter counted once. With clipping
the step needs that global norm before it updates anything: it sums the squares over every
rank (one scalar all-reduce) and scales the gradients by ``torch.nn.utils.clip_grad_norm_``'s
factor, ``max_norm / (norm + 1e-6)`` at most 1, first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch.optim.adamw import adamw

from .grads import GradSync
from .params import PartStore
from .parts import Part
from .schedule import Schedule
from .shards import MAX_BUCKET_ELEMENTS, MIN_BUCKET_ELEMENTS
from .trace import Tracer


@dataclass(frozen=True)
class StepStats:
    """What one optimizer step saw of the gradients, before any clipping."""

    owned_sq: float  # squared norm of the summed gradients of the parts this rank owns
    total_sq: float | None  # the same over every rank, where the step needed it (clipping)


class RankOptimizer(Protocol):
    """What the trainer and the checkpoints ask of a rank's optimizer."""

    sync: GradSync  # its gradient reduction, which the executor drives during the backward

    def step(self, lr: float | None = None) -> StepStats:
        """Reduce gradients over each part's holders, clip them (where the optimizer clips),
        update at learning rate ``lr`` (None: the one it was made with) times each part's
        scale, leave every holder's weights identical and the gradients cleared."""

    def set_lr(self, lr: float) -> None:
        """The base learning rate of the coming step (before its passes: a sharded optimizer
        may update a bucket during the last pass's backward)."""

    def part_state(self, part: Part) -> dict[str, dict[str, torch.Tensor]] | None:
        """The part's whole state by parameter name on its first holder (a collective over the
        part's holders; what other holders get back is unspecified)."""

    def load_part_state(self, part: Part, saved: dict[str, dict[str, torch.Tensor]]) -> None:
        """Restore what this rank keeps of a part's state from its whole saved state."""

    def state_elements(self) -> dict[str, int]:
        """Optimizer-state elements held on this rank, by part key."""

    def state_bytes(self) -> int:
        """Bytes of optimizer state held on this rank."""


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    scales: Sequence[float] | None = None,
) -> torch.optim.AdamW:
    """torch's fused AdamW over ``params``; ``scales[i]``: the factor on ``params[i]``'s
    learning rate (a parameter group per factor, each remembering it as ``lr_scale``)."""
    params = list(params)
    if not params:  # a rank holding only frozen parts still steps (nothing)
        params = [torch.nn.Parameter(torch.zeros(0), requires_grad=False)]
        scales = None
    by_scale: dict[float, list[torch.nn.Parameter]] = {}
    for i, p in enumerate(params):
        by_scale.setdefault(1.0 if scales is None else float(scales[i]), []).append(p)
    groups = [{"params": ps, "lr": lr * k, "lr_scale": k} for k, ps in by_scale.items()]
    return torch.optim.AdamW(
        groups, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, fused=True
    )


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group of ``opt`` at ``lr`` times its ``lr_scale``."""
    for group in opt.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def scale_of(lr_scales: Iterable[tuple[str, float]]) -> Callable[[Part], float]:
    """A part's factor on the learning rate: its module's ``lr_scale``, else 1."""
    table = dict(lr_scales)
    return lambda part: table.get(part.module, 1.0)


def squares(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The sum of squares of every element, in float64 (a 0-d tensor on their device). One
    fused norm over the list (the kernel ``clip_grad_norm_`` uses), not a call per tensor:
    the step logs the gradient norm every step, so its cost is paid every step."""
    present = [t for t in tensors if t.numel()]
    if not present:
        return torch.zeros((), dtype=torch.float64)
    norms = torch._foreach_norm(present, 2, dtype=torch.float64)
    return torch.stack(norms).square().sum()


def world_sum(value: torch.Tensor) -> float:
    """``value`` summed over every rank of the run (one all-reduce of a scalar)."""
    if not dist.is_initialized():
        return float(value)
    out = value.detach().clone().reshape(1)
    dist.all_reduce(out)
    return float(out[0])


def clip_factor(total_sq: float, max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_``'s factor on every gradient: ``max_norm / (norm +
    1e-6)``, at most 1 (1 when ``max_norm`` is 0: no clipping)."""
    if max_norm <= 0:
        return 1.0
    return min(1.0, max_norm / (math.sqrt(total_sq) + 1e-6))


def adamw_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    steps: Sequence[int],
    hyper: Mapping[str, float],
    lrs: Sequence[float] | None = None,
) -> None:
    """One fused AdamW step of tensors kept outside ``torch.optim`` (the sharded optimizer's
    shards), ``steps[i]`` being the step number tensor ``i`` takes (1 for the first), exactly
    as ``make_optimizer``'s optimizer would take it; ``lrs[i]``: tensor ``i``'s learning rate
    (else ``hyper["lr"]``), one fused call per distinct rate."""
    if not params:
        return
    if lrs is not None and len(set(lrs)) > 1:
        for rate in dict.fromkeys(lrs):
            pick = [i for i, r in enumerate(lrs) if r == rate]
            lists = [[seq[i] for i in pick] for seq in (params, grads, exp_avgs, exp_avg_sqs)]
            adamw_step(*lists, [steps[i] for i in pick], {**hyper, "lr": rate})
        return
    if lrs:
        hyper = {**hyper, "lr": lrs[0]}
    # adamw counts them up itself; the fused kernel wants them on the tensors' device
    counts = [
        torch.tensor(float(n - 1), device=p.device) for n, p in zip(steps, params, strict=True)
    ]
    adamw(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), [], counts,
          fused=True, amsgrad=False, maximize=False, **hyper)  # fmt: skip


def param_state(opt: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """A parameter's optimizer state as CPU tensors (empty before its first step)."""
    return {k: v.detach().cpu().clone() for k, v in opt.state.get(param, {}).items()}


def load_param_state(
    opt: torch.optim.Optimizer, param: torch.Tensor, state: dict[str, torch.Tensor]
) -> None:
    """Restore a parameter's state; ``step`` keeps its own dtype (a float32 scalar)."""
    if not state:
        opt.state.pop(param, None)
        return
    opt.state[param] = {  # the fused step counts on the parameter's device
        k: v.to(param.device).clone() if k == "step" else v.to(param.device, param.dtype).clone()
        for k, v in state.items()
        if k in ("step", "exp_avg", "exp_avg_sq")  # a sharded run's fp32 masters have no use here
    }


class ReplicatedAdamW:
    """ZeRO stage 0 (``--optimizer-sharding off``): gradients all-reduced over each part's
    holders, bucket by bucket during the backward (``grads.py``), and every holder keeps the
    part's whole AdamW state and takes the same step."""

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        store: PartStore,
        groups: dict[tuple[int, ...], dist.ProcessGroup],
        *,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float],
        eps: float,
        ready: Mapping[Part, tuple[int, ...]] | None = None,
        tracer: Tracer | None = None,
        keep: Callable[[torch.Tensor, str], None] | None = None,
        max_bucket_elements: int = MAX_BUCKET_ELEMENTS,
        min_bucket_elements: int = MIN_BUCKET_ELEMENTS,
        clip_grad: float = 0.0,
        lr_scales: Iterable[tuple[str, float]] = (),
    ):
        self.rank, self.store, self.holders = rank, store, schedule.holder_map
        self.tracer = tracer or Tracer(rank, enabled=False)
        self.keep = keep or (lambda _t, _what: None)
        self.clip_grad = clip_grad
        scale = scale_of(lr_scales)
        trained = list(store.trainable())
        self.opt = make_optimizer(
            (t for _, _, t in trained),
            lr=lr,
            weight_decay=weight_decay,
            betas=betas,
            eps=eps,
            scales=[scale(part) for part, _, _ in trained],
        )
        self.sync = GradSync(
            schedule,
            rank,
            store,
            groups,
            stage=0,
            tracer=self.tracer,
            ready=ready,
            keep=self.keep,
            max_bucket_elements=max_bucket_elements,
            min_bucket_elements=min_bucket_elements,
        )

    def step(self, lr: float | None = None) -> StepStats:
        self.sync.finish()
        self.sync.wait_all()
        self.store.fill_missing_grads()  # parts of no bucket: none, but a rank may hold nothing
        trained = list(self.store.trainable())
        owned = squares(t.grad for part, _, t in trained if self.holders[part][0] == self.rank)
        total = None
        if self.clip_grad > 0:  # every holder scales its copy of the summed gradients alike
            total = world_sum(owned)
            factor = clip_factor(total, self.clip_grad)
            if factor < 1.0:
                for _, _, t in trained:
                    t.grad.mul_(factor)
        if lr is not None:
            self.set_lr(lr)
        with self.tracer.span("optimizer", "optimizer"):
            self.opt.step()
            for state in self.opt.state.values():  # torch allocates it at the first step
                for k, v in state.items():
                    if k != "step":
                        self.keep(v, "optimizer")
            self.opt.zero_grad(set_to_none=True)
        return StepStats(float(owned), total)

    def set_lr(self, lr: float) -> None:
        set_lr(self.opt, lr)

    def part_state(self, part: Part) -> dict[str, dict[str, torch.Tensor]] | None:
        if self.holders[part][0] != self.rank:
            return None
        return {n: param_state(self.opt, t) for n, t in self.store[part].named_parameters()}

    def load_part_state(self, part: Part, saved: dict[str, dict[str, torch.Tensor]]) -> None:
        for name, t in self.store[part].named_parameters():
            if t.requires_grad:
                load_param_state(self.opt, t, saved.get(name, {}))

    def take_part_state(self, part: Part, other: object) -> bool:
        """Adopt ``part``'s state from ``other``, the previous plan's optimizer in a run that
        switches plans, where this rank held the very same parameters (``switch.py``)."""
        if type(other) is not type(self):
            return False
        for _, t in self.store[part].named_parameters():
            if t.requires_grad and t in other.opt.state:  # type: ignore[attr-defined]
                self.opt.state[t] = other.opt.state[t]  # type: ignore[attr-defined]
        return True

    def state_elements(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for part, _, t in self.store.trainable():
            held = sum(v.numel() for k, v in self.opt.state.get(t, {}).items() if k != "step")
            if held:
                out[part.key] = out.get(part.key, 0) + held
        return out

    def state_bytes(self) -> int:
        return sum(
            v.numel() * v.element_size()
            for state in self.opt.state.values()
            for k, v in state.items()
            if k != "step"
        )
