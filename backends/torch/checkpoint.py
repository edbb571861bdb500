"""Checkpoints stored per module and part, so that any plan on any number of ranks can resume.

Layout of ``DIR``::

    DIR/latest                      name of the newest complete checkpoint ("step-000005")
    DIR/step-000005/manifest.json   step, seed, dtype, spec hash, the parts it holds
    DIR/step-000005/MODULE/ROLE.pt  one part: its parameters and their AdamW state

A part's file holds its whole AdamW state per parameter (``step``, ``exp_avg``, ``exp_avg_sq``,
and ``master`` when a narrow training dtype keeps fp32 master weights), however the run that
wrote it kept that state: with the sharded optimizer the holders' shards are gathered onto the
part's first holder before the write, and a resuming holder cuts its own shard back out, so the
files do not depend on the plan, the world size or the optimizer sharding.

Every part is written by one of its holders (the lowest rank), each file atomically (a temporary
file, then a rename); after a barrier rank 0 writes the manifest and only then moves ``latest``,
so a run killed half-way through a checkpoint leaves the previous one in force. On resume each
rank reads the files of the parts it holds under the new plan, whichever ranks wrote them, and
the data source continues at the saved step, so the run goes on exactly as if never stopped.
The learning-rate schedule is a function of the step, so the manifest's step carries it too.

With ``keep = N`` only the newest N checkpoints stay: once ``latest`` names the new one, rank 0
renames each older folder out of the ``step-*`` pattern (one atomic rename, so a folder is a
whole checkpoint or none) and then deletes it.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from spindle_dsl.atomic import write_atomic
from spindle_dsl.errors import ExecutionError

from .optim import RankOptimizer
from .params import PartStore
from .parts import Part
from .schedule import Schedule

FORMAT = "spindle-checkpoint"


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint on disk."""

    path: Path
    step: int
    manifest: dict[str, Any]


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:06d}"


def part_file(folder: Path, part: Part) -> Path:
    return folder / part.module / f"{part.role}.pt"


def _serialise(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _write_part(folder: Path, part: Part, module: torch.nn.Module, optimizer: Any) -> None:
    state = {
        "part": part.key,
        "params": {n: t.detach().cpu().clone() for n, t in module.named_parameters()},
        "optimizer": optimizer,
    }
    write_atomic(part_file(folder, part), _serialise(state))


def save(
    root: str | Path,
    step: int,
    schedule: Schedule,
    rank: int,
    store: PartStore,
    opt: RankOptimizer,
    meta: dict[str, Any],
    *,
    parked: Mapping[Part, tuple[torch.nn.Module, Any]] | None = None,
    parked_parts: Sequence[Part] = (),
    keep: int = 0,
) -> Path:
    """Write the checkpoint of ``step`` (a collective: every rank must call it). Parts go in
    the schedule's global order, so the gathers of sharded state meet on every holder.
    ``parked``: parts of tasks the current phase of a schedule leaves out that this rank
    keeps (module, whole optimizer state), written too; ``parked_parts``: all of them, on
    every rank, for the manifest; ``keep``: how many of the newest checkpoints stay (0:
    all)."""
    folder = step_dir(root, step)
    for part, holders in schedule.holders:
        if rank not in holders:
            continue
        optimizer = opt.part_state(part)
        if min(holders) != rank:
            continue
        _write_part(folder, part, store[part], optimizer)
    for part, (module, optimizer) in (parked or {}).items():
        _write_part(folder, part, module, optimizer)
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        manifest = {
            "format": FORMAT,
            "version": 1,
            "step": step,
            "parts": [p.key for p, _ in schedule.holders] + [p.key for p in parked_parts],
            **meta,
        }
        write_atomic(folder / "manifest.json", json.dumps(manifest, indent=1) + "\n")
        write_atomic(Path(root) / "latest", folder.name + "\n")
        if keep > 0:
            prune(root, keep)
    if dist.is_initialized():
        dist.barrier()
    return folder


def prune(root: str | Path, keep: int) -> list[Path]:
    """Remove every checkpoint folder but the newest ``keep`` (``latest``'s among them), the
    older first; the folders removed. Each is renamed out of the ``step-*`` pattern before
    its files go, so no reader ever sees a part of one."""
    current = latest(root)
    if current is None:
        return []
    for stale in Path(root).glob(".removing-step-*"):  # what an interrupted prune left
        shutil.rmtree(stale, ignore_errors=True)
    folders = sorted(
        (p for p in Path(root).glob("step-*") if p.is_dir() and p.name[5:].isdigit()),
        key=lambda p: int(p.name[5:]),
    )
    older = [p for p in folders if int(p.name[5:]) < current.step]
    kept = [p for p in older if (p / "manifest.json").exists()][-(keep - 1) :] if keep > 1 else []
    removed = []
    for folder in older:
        if folder in kept:
            continue
        doomed = folder.with_name(f".removing-{folder.name}")
        folder.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(folder)
    return removed


def latest(root: str | Path) -> CheckpointInfo | None:
    """The newest complete checkpoint under ``root``, or None if there is none yet."""
    pointer = Path(root) / "latest"
    if not pointer.exists():
        return None
    folder = Path(root) / pointer.read_text().strip()
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ExecutionError(f"checkpoint {folder} is unreadable: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise ExecutionError(f"{folder} is not a spindle checkpoint")
    return CheckpointInfo(folder, int(manifest["step"]), manifest)


def check_compatible(info: CheckpointInfo, meta: dict[str, Any]) -> None:
    """Refuse to resume a checkpoint of another model, seed or dtype."""
    for key in ("spec_sha256", "dtype", "seed"):
        have, want = info.manifest.get(key), meta.get(key)
        if have and want and have != want:
            raise ExecutionError(
                f"checkpoint {info.path} was written with {key} = {have}, this run has {want}; "
                f"use another --checkpoint-dir or pass --no-resume"
            )


def read_part(info: CheckpointInfo, part: Part) -> dict[str, Any]:
    """One part's saved record: ``params`` by name and the whole ``optimizer`` state."""
    try:
        return torch.load(part_file(info.path, part), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ExecutionError(
            f"checkpoint {info.path} has no {part.key}: it was written for another spec"
        ) from None


def load(
    info: CheckpointInfo, store: PartStore, opt: RankOptimizer, *, only_listed: bool = False
) -> None:
    """Load every part this rank holds, parameters and optimizer state, from ``info``.
    ``only_listed``: a part the manifest does not list keeps its initial weights (a run
    following a schedule builds a task's parts when the task first trains)."""
    listed = set(info.manifest.get("parts", ()))
    for part in store.parts:
        if only_listed and part.key not in listed:
            continue
        state = read_part(info, part)
        load_params(info, part, store[part], state)
        opt.load_part_state(part, state["optimizer"])


def load_params(
    info: CheckpointInfo, part: Part, module: torch.nn.Module, state: dict[str, Any]
) -> None:
    """Copy a part's saved parameters into ``module`` (names and shapes checked)."""
    path = part_file(info.path, part)
    params = dict(module.named_parameters())
    if set(state["params"]) != set(params):
        raise ExecutionError(f"{path}: parameters differ from the model's {part.key}")
    with torch.no_grad():
        for name, t in params.items():
            saved = state["params"][name]
            if saved.shape != t.shape:
                raise ExecutionError(
                    f"{path}: {name} has shape {tuple(saved.shape)}, the model {tuple(t.shape)}"
                )
            t.copy_(saved.to(dtype=t.dtype))
