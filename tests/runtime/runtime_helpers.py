"""Running the runtime in tests and comparing it with the single-process oracle."""

from __future__ import annotations

from pathlib import Path

import torch

from spindle_dsl.backends.torch import checkpoint as ck
from spindle_dsl.backends.torch.parts import Part

REPO = Path(__file__).resolve().parents[2]


def checkpoint_state(root: str | Path) -> dict[str, dict[str, torch.Tensor]]:
    """Every parameter of the newest checkpoint under ``root``, by part key and name."""
    info = ck.latest(root)
    assert info is not None, f"no checkpoint under {root}"
    out = {}
    for key in info.manifest["parts"]:
        saved = torch.load(ck.part_file(info.path, Part.from_key(key)), weights_only=True)
        out[key] = saved["params"]
    return out


def worst_relative(
    expected: dict[str, dict[str, torch.Tensor]], got: dict[str, dict[str, torch.Tensor]]
) -> tuple[float, str]:
    """The largest per-tensor relative error ||got - expected|| / ||expected||, and where."""
    assert set(expected) == set(got), set(expected) ^ set(got)
    worst, where = 0.0, ""
    for key, params in expected.items():
        assert set(params) == set(got[key]), key
        for name, want in params.items():
            have = got[key][name].to(want.dtype)
            err = float((have - want).norm() / want.norm().clamp_min(1e-300))
            if err > worst:
                worst, where = err, f"{key}:{name}"
    return worst, where


def loss_errors(history: list[dict[str, float]], steps) -> float:
    """The largest relative difference between the oracle's losses and a run's."""
    assert len(history) == len(steps)
    return max(
        abs(value - want[task]) / abs(want[task])
        for want, record in zip(history, steps, strict=True)
        for task, value in record.losses
    )
