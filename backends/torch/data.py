"""Training data: a deterministic synthetic source per task, and binding real datasets to tasks.

Every sample is addressed by (task, index): step ``s`` of a task with batch ``B`` reads indices
``s*B .. s*B+B-1``, and any rank can produce any sample on its own. So a rank reads exactly the
rows of its shard, whatever the plan and the number of ranks, and the single-process oracle
reads the same samples: nothing about the data depends on the schedule.

The synthetic source draws each sample from a generator seeded by (seed, task, modality,
index): token ids are arithmetic progressions modulo the vocabulary (so a language model has
something to learn), features and image patches are standard normal. A real dataset is any
``torch.utils.data.Dataset`` whose items are dicts keyed by modality name (token ids as a 1-D
integer tensor, features and flattened ``3 x patch x patch`` image patches as a 2-D float
tensor, one row per token), plus ``target`` for an ``mse`` task; ``bind`` checks what it gives.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.data import Dataset

from spindle_dsl.errors import ExecutionError
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph

Form = Literal["vocab", "features", "image"]


@dataclass(frozen=True)
class InputNeed:
    """What one task reads of one raw modality: tokens per sample and the width of each."""

    task: str
    modality: str
    form: Form
    tokens: int  # the most any edge of the task reads (edges take a prefix)
    width: int  # features or pixels per token; the vocabulary size for token ids


@dataclass(frozen=True)
class TargetNeed:
    """The regression target of one sink of an ``mse`` task."""

    task: str
    sink: str
    shape: tuple[int, int]  # (tokens, width) of the sink's output


def _raw_width(graph: MetaGraph, module: str, modality: str) -> tuple[Form, int]:
    m = graph.modality(modality)
    if m.vocab is not None:
        return "vocab", m.vocab
    if m.features is not None:
        return "features", m.features
    info = graph.module(module)
    kind, args = get_kind(info.kind), dict(info.args)
    if hasattr(kind, "patch_features"):
        return "image", int(kind.patch_features(args))
    if "patch" in args:
        return "image", 3 * int(args["patch"]) ** 2
    raise ExecutionError(
        f"module {module} ({info.kind}) reads image modality {modality} but says no patch size"
    )


def input_needs(graph: MetaGraph) -> dict[str, dict[str, InputNeed]]:
    """Per task, per modality: what its MetaOps read."""
    out: dict[str, dict[str, InputNeed]] = {}
    for op in graph.metaops:
        if op.batch <= 0:
            continue
        for inp in op.inputs:
            if not inp.from_modality:
                continue
            form, width = _raw_width(graph, op.segments[0][0], inp.source)
            have = out.setdefault(op.task, {}).get(inp.source)
            if have is not None and (have.form, have.width) != (form, width):
                raise ExecutionError(
                    f"task {op.task} reads {inp.source} with {have.width} and {width} values per "
                    f"token (two encoders with different patch sizes); use one patch size"
                )
            tokens = max(inp.tokens, have.tokens if have else 0)
            out[op.task][inp.source] = InputNeed(op.task, inp.source, form, tokens, width)
    return out


def target_needs(graph: MetaGraph) -> dict[str, tuple[TargetNeed, ...]]:
    return {
        t.name: tuple(
            TargetNeed(t.name, s, (graph.op(s).out_tokens, graph.op(s).out_width)) for s in t.sinks
        )
        for t in graph.tasks
        if t.loss == "mse" and t.batch > 0
    }


def _generator(seed: int, *parts: object) -> torch.Generator:
    digest = hashlib.sha256("|".join(str(p) for p in (seed, *parts)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


class SyntheticSource(Dataset):
    """The default data of one task: sample ``i`` is a pure function of (seed, task, i)."""

    def __init__(self, graph: MetaGraph, task: str, seed: int):
        self.needs = input_needs(graph).get(task, {})
        self.targets = target_needs(graph).get(task, ())
        self.task, self.seed = task, seed

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
    """Batches of raw inputs and targets for the runtime and the oracle alike."""

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
        self.sources: dict[str, Any] = {
            t.name: datasets[t.name] if t.name in datasets else SyntheticSource(graph, t.name, seed)
            for t in graph.tasks
        }
        for name, ds in datasets.items():
            if len(ds) == 0:
                raise ExecutionError(f"the dataset bound to task {name} is empty")
            self._check(name, ds[0])

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

    def rows(self, task: str, step: int, lo: int, hi: int) -> dict[str, torch.Tensor]:
        """Rows ``[lo, hi)`` of ``task``'s batch at ``step`` (0-based): each modality stacked to
        (rows, tokens[, width]) and each target to (rows, tokens, width), on the device."""
        base = self.positions(task, step) if self.positions else step * self.batches[task]
        source = self.sources[task]
        samples = [source[(base + i) % len(source)] for i in range(lo, hi)]
        out: dict[str, torch.Tensor] = {}
        for name, need in self.needs.get(task, {}).items():
            if need.form == "vocab":
                cols = [torch.as_tensor(s[name])[: need.tokens].long() for s in samples]
                empty = torch.zeros(0, need.tokens, dtype=torch.long)
            else:
                cols = [torch.as_tensor(s[name])[: need.tokens].to(self.dtype) for s in samples]
                empty = torch.zeros(0, need.tokens, need.width, dtype=self.dtype)
            out[name] = (torch.stack(cols) if cols else empty).to(self.device)
        for t in self.targets.get(task, ()):
            cols = [torch.as_tensor(s[self._target_key(task, t.sink, s)]) for s in samples]
            stacked = torch.stack(cols) if cols else torch.zeros(0, *t.shape)
            out[f"target:{t.sink}"] = stacked.to(self.dtype).to(self.device)
        return out
