"""Trained weights out: the whole model (every module's layers, input stages and heads) as one
safetensors file, keyed ``MODULE.ROLE.PARAM`` (the keys ``from "w.safetensors"`` reads).

From a checkpoint folder the tensors are the newest checkpoint's, as trained; without one they
are the initial weights (each module's ``from`` file, or the seeded initialisation), so an
untrained model can be exported as well. Either way every key and shape is checked against the
model the spec builds, and the file is written atomically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph

from . import checkpoint as ck
from .params import DTYPES, PartStore
from .parts import graph_parts
from .weights import check_weights, expected_shapes, flat_key, write_safetensors


@dataclass(frozen=True)
class Exported:
    """What ``export_model`` wrote."""

    path: str
    tensors: int
    params: int
    source: str  # "checkpoint step N (DIR)" or "initial weights"


def initial_tensors(graph: MetaGraph, seed: int = 0, dtype: str = "float32") -> dict:
    """Every parameter of the model as training would start: from ``from`` files or seeded."""
    parts = graph_parts(graph)
    check_weights(graph, parts)
    store = PartStore(graph, parts, seed, DTYPES[dtype])
    return {flat_key(p, n): t.detach() for p in parts for n, t in store[p].named_parameters()}


def checkpoint_tensors(graph: MetaGraph, root: str | os.PathLike[str]) -> tuple[dict, int]:
    """Every parameter from the newest checkpoint under ``root``, checked against the model;
    and the checkpoint's step."""
    info = ck.latest(root)
    if info is None:
        raise ExecutionError(f"{root} holds no checkpoint (train with --checkpoint-dir first)")
    parts = graph_parts(graph)
    want = expected_shapes(graph, parts)
    out: dict[str, torch.Tensor] = {}
    problems = []
    for part in parts:
        path = ck.part_file(info.path, part)
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)["params"]
        except FileNotFoundError:
            problems.append(f"it has no {part.key} (written for another spec?)")
            continue
        mine = {k for k in want if k.startswith(flat_key(part, ""))}
        for name, t in saved.items():
            key = flat_key(part, name)
            if key not in mine:
                problems.append(f"{part.key} has a parameter {name} the model does not")
            elif tuple(t.shape) != want[key]:
                problems.append(f"{key}: {list(t.shape)} in the checkpoint, {list(want[key])} here")
            out[key] = t
        got = {flat_key(part, n) for n in saved}
        problems += [f"{k} is missing" for k in sorted(mine - got)]
    if problems:
        raise ExecutionError(
            f"checkpoint {info.path} does not fit this spec:\n  " + "\n  ".join(problems)
        )
    return out, info.step


def model_tensors(
    graph: MetaGraph,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    dtype: str = "float32",
) -> tuple[dict, str]:
    """Every parameter by ``MODULE.ROLE.PARAM``, from the newest checkpoint under
    ``checkpoint_dir`` or the initial weights; and where they came from, for messages."""
    if checkpoint_dir is not None:
        tensors, step = checkpoint_tensors(graph, checkpoint_dir)
        return tensors, f"checkpoint step {step} ({checkpoint_dir})"
    return initial_tensors(graph, seed, dtype), "initial weights"


def export_model(
    graph: MetaGraph,
    out: str | os.PathLike[str],
    *,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    dtype: str = "float32",
) -> Exported:
    """Write the model's weights to ``out`` (see the module docstring)."""
    tensors, source = model_tensors(graph, checkpoint_dir, seed, dtype)
    flat = {k: t.detach().cpu().contiguous() for k, t in tensors.items()}
    metadata = {"format": "pt", "producer": "spindle export", "spec": graph.spec_path}
    write_safetensors(out, flat, metadata)
    return Exported(str(out), len(flat), sum(t.numel() for t in flat.values()), source)
