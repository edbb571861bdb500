"""Where rank 0 writes each step: a JSON-lines file and a TensorBoard event folder.

Both get the same figures (``StepRecord.to_json``): the loss per task, the held-out loss per
task where the step evaluated, the learning rate, the global gradient norm before clipping,
the step's seconds, tokens and samples per second and the model FLOPs utilisation. The JSON
file is appended to when a run resumes (so one file holds the whole run) and flushed every
step; TensorBoard's scalars are named ``loss/TASK``, ``eval_loss/TASK``, ``lr``, ``grad_norm``,
``seconds``, ``tokens_per_s``, ``samples_per_s`` and ``mfu``, with the step as their step.
"""

from __future__ import annotations

import json
from typing import Any

from spindle_dsl.errors import ExecutionError

from ..base import StepRecord

_PER_TASK = ("loss", "eval_loss")


def scalars(record: StepRecord) -> dict[str, float]:
    """The record's figures as flat scalar names (``loss/caption``, ``lr``, ...)."""
    out: dict[str, float] = {}
    for key, value in record.to_json().items():
        if key in _PER_TASK:
            out.update({f"{key}/{task}": float(v) for task, v in value.items()})
        elif isinstance(value, int | float) and key != "step":
            out[key] = float(value)
    return out


def summary_writer_class() -> Any:
    """torch's ``SummaryWriter``; a clear error where tensorboard is not installed (checked
    before any worker starts)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ExecutionError(
            "--tensorboard needs the tensorboard package: pip install 'spindle-dsl[tensorboard]'"
        ) from None
    return SummaryWriter


def tensorboard_writer(folder: str) -> Any:
    """A ``SummaryWriter`` writing its event file into ``folder``."""
    return summary_writer_class()(log_dir=folder)


class StepLog:
    """The run's step records on disk (rank 0 only)."""

    def __init__(self, json_path: str | None, tensorboard: str | None, *, append: bool):
        self.json = open(json_path, "a" if append else "w") if json_path else None  # noqa: SIM115
        self.board = tensorboard_writer(tensorboard) if tensorboard else None

    def write(self, record: StepRecord) -> None:
        if self.json is not None:
            self.json.write(json.dumps(record.to_json()) + "\n")
            self.json.flush()
        if self.board is not None:
            for name, value in scalars(record).items():
                self.board.add_scalar(name, value, record.step)
            self.board.flush()

    def close(self) -> None:
        if self.json is not None:
            self.json.close()
        if self.board is not None:
            self.board.close()
