"""The optimizer, and its per-parameter state as checkpoints store it.

AdamW updates each parameter from that parameter's own gradient and state alone, so a rank that
holds a subset of the parameters, given the same summed gradients, computes exactly the
single-process update for them. Every holder, the oracle and a resumed run use the same
per-tensor (``foreach=False``) implementation, so they share one code path whatever torch's
default for the device (on tiny_mm the multi-tensor one gave bitwise the same parameters and was
about a third faster in the optimizer step, a small share of a training step).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


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
        params, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, foreach=False
    )


def param_state(opt: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """A parameter's optimizer state as CPU tensors (empty before its first step)."""
    return {k: v.detach().cpu().clone() for k, v in opt.state.get(param, {}).items()}


def load_param_state(
    opt: torch.optim.Optimizer, param: torch.Tensor, state: dict[str, torch.Tensor]
) -> None:
    """Restore a parameter's state; ``step`` keeps its own dtype and device (a CPU scalar)."""
    if not state:
        return
    opt.state[param] = {
        k: v.clone() if k == "step" else v.to(device=param.device, dtype=param.dtype).clone()
        for k, v in state.items()
    }
