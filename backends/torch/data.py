"""Training data: each task's source (synthetic, a folder of arrays, a dataset), read by row.

Every sample is addressed by (task, position): a task's samples are numbered from 0 across the
whole run, a step reads the rows ``first .. first+B-1`` where ``first`` is the position of its
first row (``step * B`` while the batch stays B), and sample ``position mod len(source)`` is
what a row holds. Any rank can produce any sample on its own, so a rank reads exactly the rows
of its shard, whatever the plan and the number of ranks, and the single-process oracle reads the
same samples: nothing about the data depends on the schedule, and a resumed run reads what an
uninterrupted one would have.

Each task's source is, in order of precedence: a dataset bound from Python (or a folder or
``package.module:function`` given as a string, as ``spindle train --data`` does), the task's
``data = "..."`` in the spec, or the synthetic source. The synthetic source draws each sample
from a generator seeded by (seed, task, modality, index): token ids are arithmetic progressions
modulo the vocabulary (so a language model has something to learn), features and image patches
are standard normal. Folders of ``.npy`` arrays are described in ``datafiles.py``. A dataset is
any ``torch.utils.data.Dataset`` whose items are dicts keyed by modality name (token ids as a
1-D integer tensor, features and flattened ``3 x patch x patch`` image patches as a 2-D float
tensor, one row per token), plus ``target`` for an ``mse`` task, and optionally ``NAME.len``
(a row's real tokens) and ``NAME.labels`` (lm targets) as ``masks.py`` describes; ``TaskData``
checks what it gives.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph

from .datafiles import NpyFolder, open_source, target_file, write_task_folder
from .masks import LABELS, LEN
from .needs import InputNeed, TargetNeed, input_needs, target_needs

__all__ = [
    "DictDataset",
    "InputNeed",
    "SyntheticSource",
    "TargetNeed",
    "TaskData",
    "input_needs",
    "synthesize",
    "target_needs",
]


def _generator(seed: int, *parts: object) -> torch.Generator:
    digest = hashlib.sha256("|".join(str(p) for p in (seed, *parts)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


class SyntheticSource(Dataset):
    """The default data of one task: sample ``i`` is a pure function of (seed, task, i).
    ``variable_length``: each token-id or feature modality's row also has a length, drawn
    between half its tokens (at least 2) and all of them, the positions after it zeros."""

    def __init__(self, graph: MetaGraph, task: str, seed: int, variable_length: bool = False):
        self.needs = input_needs(graph).get(task, {})
        self.targets = target_needs(graph).get(task, ())
        self.task, self.seed, self.variable_length = task, seed, variable_length

    def __len__(self) -> int:
        return 2**62  # unbounded: every index is a sample

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, need in self.needs.items():
            g = _generator(self.seed, self.task, name, index)
            if need.form == "vocab":
                start = torch.randint(need.width, (1,), generator=g)
                stride = torch.randint(1, 8, (1,), generator=g)
                out[name] = (start + stride * torch.arange(need.tokens)) % need.width
            else:
                out[name] = torch.randn(need.tokens, need.width, generator=g)
            if self.variable_length and need.form != "image":
                low = min(max(2, need.tokens // 2), need.tokens)
                n = int(torch.randint(low, need.tokens + 1, (1,), generator=g))
                out[name][n:] = 0
                out[f"{name}.len"] = torch.tensor(n)
        for t in self.targets:
            g = _generator(self.seed, self.task, f"target:{t.sink}", index)
            out[f"target:{t.sink}"] = torch.randn(*t.shape, generator=g)
        return out


class DictDataset(Dataset):
    """A dataset from tensors whose first axis indexes samples: ``DictDataset(text=ids, ...)``.

    A convenience for binding in-memory data (and picklable to ``--nproc`` workers)."""

    def __init__(self, **columns: torch.Tensor):
        lengths = {len(v) for v in columns.values()}
        if len(lengths) != 1:
            raise ExecutionError(f"DictDataset columns differ in length: {sorted(lengths)}")
        self.columns = columns

    def __len__(self) -> int:
        return next(iter(self.columns.values())).shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[index] for k, v in self.columns.items()}


class TaskData:
    """Batches of raw inputs and targets for the runtime and the oracle alike.

    ``datasets`` maps a task to a dataset, or to a folder or ``package.module:function`` as a
    string; it overrides the task's ``data`` in the spec. Every source is checked here, so a
    bad one fails before anything trains (the ``--nproc`` parent builds one to check)."""

    def __init__(
        self,
        graph: MetaGraph,
        seed: int,
        datasets: Mapping[str, Any] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        positions: Callable[[str, int], int] | None = None,
    ):
        """``positions(task, step)``: the index of the task's first sample at ``step`` (a run
        that follows a schedule of mixes counts the batches each task took; by default
        ``step * batch``)."""
        self.graph, self.dtype, self.device = graph, dtype, torch.device(device)
        self.positions = positions
        self.needs = input_needs(graph)
        self.targets = target_needs(graph)
        self.batches = {t.name: t.batch for t in graph.tasks}
        datasets = dict(datasets or {})
        unknown = sorted(set(datasets) - set(self.batches))
        if unknown:
            raise ExecutionError(f"datasets bound to unknown tasks: {', '.join(unknown)}")
        self.sources: dict[str, Any] = {}
        self.extras: dict[str, frozenset[str]] = {}  # per task: the len:/labels: keys it gives
        for t in graph.tasks:
            bound = datasets.get(t.name, t.data)
            self.sources[t.name] = (
                SyntheticSource(graph, t.name, seed) if bound is None else self._open(t.name, bound)
            )
            self.extras[t.name] = self._extras(t.name, self.sources[t.name])

    def _open(self, task: str, bound: Any) -> Any:
        """The source ``bound`` names, checked against what ``task`` reads."""
        if isinstance(bound, str | os.PathLike):
            source = open_source(bound, task, self.needs.get(task, {}), self.targets.get(task, ()))
            if isinstance(source, NpyFolder):
                return source  # checked whole, from the arrays' headers, when opened
        else:
            source = bound
        if len(source) == 0:
            raise ExecutionError(f"the dataset bound to task {task} is empty")
        self._check(task, source[0])
        return source

    def _extras(self, task: str, source: Any) -> frozenset[str]:
        if isinstance(source, NpyFolder):
            return source.extras
        if isinstance(source, SyntheticSource):
            first = source[0] if source.variable_length else {}
        else:
            first = source[0]
        names = self.needs.get(task, {})
        return frozenset(
            f"{prefix}{name}"
            for name in names
            for prefix, suffix in ((LEN, "len"), (LABELS, "labels"))
            if f"{name}.{suffix}" in first
        )

    def describe(self) -> dict[str, str]:
        """Where each task's samples come from, in words (for the train command to show)."""
        out = {}
        for task, source in self.sources.items():
            if isinstance(source, SyntheticSource):
                out[task] = "synthetic"
            elif isinstance(source, NpyFolder):
                out[task] = f"{source.folder} ({len(source)} samples)"
            else:
                name = getattr(source, "reference", type(source).__name__)
                out[task] = f"{name} ({len(source)} samples)"
        return out

    def _check(self, task: str, sample: Any) -> None:
        if not isinstance(sample, Mapping):
            raise ExecutionError(
                f"the dataset of task {task} must yield dicts keyed by modality, "
                f"got {type(sample).__name__}"
            )
        for name, need in self.needs.get(task, {}).items():
            if name not in sample:
                raise ExecutionError(f"the dataset of task {task} gives no '{name}'")
            x = torch.as_tensor(sample[name])
            want = "(tokens,) integer ids" if need.form == "vocab" else f"(tokens, {need.width})"
            ok = (
                x.dim() == 1
                if need.form == "vocab"
                else (x.dim() == 2 and x.shape[1] == need.width)
            )
            if not ok or x.shape[0] < need.tokens:
                raise ExecutionError(
                    f"task {task}, modality {name}: expected {want} with at least {need.tokens} "
                    f"tokens, got shape {tuple(x.shape)}"
                )
        for t in self.targets.get(task, ()):
            key = self._target_key(task, t.sink, sample)
            if key is None:
                raise ExecutionError(f"the dataset of mse task {task} gives no 'target'")
            if tuple(torch.as_tensor(sample[key]).shape) != t.shape:
                raise ExecutionError(
                    f"task {task}: the target must have the shape of {t.sink}'s output "
                    f"{t.shape}, got {tuple(torch.as_tensor(sample[key]).shape)}"
                )

    def _target_key(self, task: str, sink: str, sample: Mapping) -> str | None:
        if f"target:{sink}" in sample:
            return f"target:{sink}"
        if "target" in sample and len(self.targets[task]) == 1:
            return "target"
        return None

    def _stack_extras(self, task: str, samples: list[Any], rows: int) -> dict[str, torch.Tensor]:
        """A dataset's ``NAME.len``/``NAME.labels`` items as ``len:``/``labels:`` rows."""
        out = {}
        for key in self.extras[task]:
            prefix, _, name = key.partition(":")
            tokens = self.needs[task][name].tokens
            values = [torch.as_tensor(s[f"{name}.{prefix}"]).long() for s in samples]
            if prefix == "len":
                out[key] = (
                    torch.stack(values).clamp(max=tokens)
                    if values
                    else torch.zeros(0, dtype=torch.long)
                )
            else:
                out[key] = (
                    torch.stack([v[:tokens] for v in values])
                    if values
                    else torch.zeros(rows, tokens)
                ).long()
        return out

    def extras_at(self, task: str, step: int, lo: int, hi: int) -> dict[str, torch.Tensor]:
        """Only the ``len:``/``labels:`` rows of ``rows`` (nothing else is read from a
        folder); empty for a task whose data gives none."""
        keys = self.extras.get(task, frozenset())
        if not keys:
            return {}
        base = self.positions(task, step) if self.positions else step * self.batches[task]
        source = self.sources[task]
        if isinstance(source, NpyFolder):
            n = len(source)
            taken = source.take([(base + i) % n for i in range(lo, hi)], keys)
            return {k: v.to(self.device) for k, v in taken.items()}
        return {k: v for k, v in self.rows_at(task, base, lo, hi).items() if k in keys}

    def rows(self, task: str, step: int, lo: int, hi: int) -> dict[str, torch.Tensor]:
        """Rows ``[lo, hi)`` of ``task``'s batch at ``step`` (0-based): ``rows_at`` from the
        task's position at ``step`` (``positions(task, step)`` when the run follows a schedule
        of mixes, else step x batch)."""
        base = self.positions(task, step) if self.positions else step * self.batches[task]
        return self.rows_at(task, base, lo, hi)

    def rows_at(self, task: str, first: int, lo: int, hi: int) -> dict[str, torch.Tensor]:
        """Rows ``[lo, hi)`` of a batch of ``task`` whose first row is the task's sample at
        global position ``first``: each modality stacked to (rows, tokens[, width]) and each
        target to (rows, tokens, width), on the device. Row ``i`` holds sample
        ``(first + i) mod len(source)``, so the caller decides positions (a run whose batch
        changes from step to step passes the running total of rows taken)."""
        source = self.sources[task]
        n = len(source)
        indices = [(first + i) % n for i in range(lo, hi)]
        if isinstance(source, NpyFolder):
            taken = source.take(indices)
            samples = None
        else:
            samples = [source[i] for i in indices]
            taken = self._stack_extras(task, samples, hi - lo)
        out: dict[str, torch.Tensor] = {
            k: v.to(self.device) for k, v in taken.items() if k in self.extras[task]
        }
        for name, need in self.needs.get(task, {}).items():
            if samples is None:
                stacked = taken[name]
            elif samples:
                stacked = torch.stack([torch.as_tensor(s[name])[: need.tokens] for s in samples])
            else:
                tail = (need.tokens,) if need.form == "vocab" else (need.tokens, need.width)
                stacked = torch.zeros(0, *tail)
            kind = torch.long if need.form == "vocab" else self.dtype
            out[name] = stacked.to(kind).to(self.device)
        for t in self.targets.get(task, ()):
            key = f"target:{t.sink}"
            if samples is None:
                stacked = taken[key]
            elif samples:
                stacked = torch.stack(
                    [torch.as_tensor(s[self._target_key(task, t.sink, s)]) for s in samples]
                )
            else:
                stacked = torch.zeros(0, *t.shape)
            out[key] = stacked.to(self.dtype).to(self.device)
        return out


def synthesize(
    graph: MetaGraph,
    out: str | os.PathLike[str],
    samples: int,
    seed: int = 0,
    variable_length: bool = False,
) -> dict[str, Path]:
    """Write the first ``samples`` samples of every task's synthetic source as a data folder
    (one sub-folder per task, the format of ``datafiles.py``): a template for real data, and
    what training on the in-memory source reads, sample for sample. ``variable_length``: rows
    of token ids and features get lengths too (``NAME.len.npy``). Returns each task's
    folder."""
    needs, targets = input_needs(graph), target_needs(graph)
    folders: dict[str, Path] = {}
    for task in graph.tasks:
        if task.batch <= 0:
            continue
        source = SyntheticSource(graph, task.name, seed, variable_length)
        first = source[0]
        arrays = {
            name: np.empty((samples, *first[name].shape), dtype=_np_dtype(first[name]))
            for name in needs.get(task.name, {})
        }
        lengths = [name for name in needs.get(task.name, {}) if f"{name}.len" in first]
        arrays.update({f"{name}.len": np.empty(samples, dtype=np.int64) for name in lengths})
        sinks = targets.get(task.name, ())
        for t in sinks:
            arrays[target_file(t.sink, sinks)[:-4]] = np.empty(
                (samples, *t.shape), dtype=np.float32
            )
        for i in range(samples):
            sample = source[i]
            for name in needs.get(task.name, {}):
                arrays[name][i] = sample[name].numpy()
            for name in lengths:
                arrays[f"{name}.len"][i] = int(sample[f"{name}.len"])
            for t in sinks:
                arrays[target_file(t.sink, sinks)[:-4]][i] = sample[f"target:{t.sink}"].numpy()
        folders[task.name] = Path(out) / task.name
        write_task_folder(folders[task.name], arrays)
    return folders


def _np_dtype(t: torch.Tensor) -> Any:
    return np.int64 if not t.is_floating_point() else np.float32
