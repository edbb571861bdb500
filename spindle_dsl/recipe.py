"""A run's training recipe: how long, at which learning rate, clipped how, evaluated when.

``TrainSettings`` is the one value every stage that trains agrees on: the spec's ``train``
block resolves to it (``language/check_train.py``, with the command line's overrides), the
CLI turns it into a ``RunConfig``, and the runtime and the single-process oracle take the
learning rate of each step from the same ``lr_at``, so a resumed run, a run that switches
plans and the oracle all follow one curve.

The schedule counts optimizer steps from 1 (the numbering of the step log): with ``W`` warmup
steps, step ``n <= W`` trains at ``lr * n / W``; after the warmup the rate stays at ``lr``
(``constant``) or falls to ``min_lr`` at step ``steps`` along a straight line (``linear``) or a
half cosine (``cosine``), so the last step trains at ``min_lr``. A module's ``lr_scale``
multiplies its rate (and so its weight decay, as a torch parameter group's ``lr`` does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

LrDecay = Literal["constant", "linear", "cosine"]
LR_DECAYS: tuple[LrDecay, ...] = ("constant", "linear", "cosine")


def lr_at(
    step: int,
    *,
    lr: float,
    steps: int,
    warmup_steps: int = 0,
    decay: str = "constant",
    min_lr: float = 0.0,
) -> float:
    """The learning rate of 0-based optimizer step ``step`` (the one after which ``step + 1``
    steps are complete): linear warmup over ``warmup_steps``, then ``decay`` to ``min_lr`` at
    step ``steps``."""
    n = step + 1
    if warmup_steps > 0 and n <= warmup_steps:
        return lr * n / warmup_steps
    if decay == "constant" or steps <= warmup_steps:
        return lr
    progress = min(1.0, (n - warmup_steps) / (steps - warmup_steps))
    if decay == "linear":
        return min_lr + (lr - min_lr) * (1.0 - progress)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class TrainSettings:
    """Every setting of a run's recipe, resolved (spec, then command line, over defaults)."""

    steps: int = 10  # optimizer steps in all (a resumed run counts those done before)
    lr: float = 1e-3  # the peak learning rate
    warmup_steps: int = 0  # steps of linear warmup from lr / warmup_steps up to lr
    lr_decay: LrDecay = "constant"
    min_lr: float = 0.0  # where linear and cosine decay end, at the last step
    weight_decay: float = 0.01  # AdamW's decoupled weight decay
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    clip_grad: float = 0.0  # the largest global gradient norm; 0 clips nothing
    seed: int = 0  # parameter initialisation and the synthetic data
    eval_every: int = 0  # evaluate every K steps (0: only after the last step)
    eval_batches: int = 1  # held-out batches per evaluation, each of the task's batch size
    checkpoint_every: int = 0  # also checkpoint every K steps (0: only at the end)
    keep_checkpoints: int = 0  # keep the newest N complete checkpoints (0: all)
    lr_scales: tuple[tuple[str, float], ...] = ()  # (module, factor on its rate), by module

    def lr_at(self, step: int) -> float:
        """The base learning rate of 0-based step ``step`` (before any module's scale)."""
        return lr_at(
            step,
            lr=self.lr,
            steps=self.steps,
            warmup_steps=self.warmup_steps,
            decay=self.lr_decay,
            min_lr=self.min_lr,
        )

    @property
    def betas(self) -> tuple[float, float]:
        return (self.beta1, self.beta2)

    def run_fields(self) -> dict[str, Any]:
        """The settings as ``RunConfig`` keywords (``betas`` as the pair AdamW takes)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["betas"] = (out.pop("beta1"), out.pop("beta2"))
        return out


DEFAULTS = TrainSettings()
