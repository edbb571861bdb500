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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import torch
import torch.distributed as dist
from torch.optim.adamw import adamw

from .grads import GradSync
from .params import PartStore
from .parts import Part
from .schedule import Schedule
from .shards import MAX_BUCKET_ELEMENTS
from .trace import Tracer


class RankOptimizer(Protocol):
    """What the trainer and the checkpoints ask of a rank's optimizer."""

    sync: GradSync  # its gradient reduction, which the executor drives during the backward

    def step(self) -> None:
        """Reduce gradients over each part's holders, update, leave every holder's weights
        identical and the gradients cleared."""

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
) -> torch.optim.AdamW:
    params = list(params)
    if not params:  # a rank holding only frozen parts still steps (nothing)
        params = [torch.nn.Parameter(torch.zeros(0), requires_grad=False)]
    return torch.optim.AdamW(
        params, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, fused=True
    )


def adamw_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    steps: Sequence[int],
    hyper: Mapping[str, float],
) -> None:
    """One fused AdamW step of tensors kept outside ``torch.optim`` (the sharded optimizer's
    shards), ``steps[i]`` being the step number tensor ``i`` takes (1 for the first), exactly
    as ``make_optimizer``'s optimizer would take it."""
    if not params:
        return
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
    ):
        self.rank, self.store, self.holders = rank, store, schedule.holder_map
        self.tracer = tracer or Tracer(rank, enabled=False)
        self.keep = keep or (lambda _t, _what: None)
        self.opt = make_optimizer(
            (t for _, _, t in store.trainable()),
            lr=lr,
            weight_decay=weight_decay,
            betas=betas,
            eps=eps,
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
        )

    def step(self) -> None:
        self.sync.finish()
        self.sync.wait_all()
        self.store.fill_missing_grads()  # parts of no bucket: none, but a rank may hold nothing
        with self.tracer.span("optimizer", "optimizer"):
            self.opt.step()
            for state in self.opt.state.values():  # torch allocates it at the first step
                for k, v in state.items():
                    if k != "step":
                        self.keep(v, "optimizer")
            self.opt.zero_grad(set_to_none=True)

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
