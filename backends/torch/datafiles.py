"""Training data from files: one folder per task, one memory-mapped ``.npy`` array per modality.

The format (what ``data = "FOLDER"`` in a task and ``spindle train --data`` read, and what
``spindle data synth`` writes)::

    DATA/                   --data DATA: one folder per task, named after it
      caption/              data = "DATA/caption" names one task's folder
        text.npy            token ids: (N, tokens) integers in [0, vocab)
        image.npy           images: (N, tokens, 3*patch*patch) float patches, or
                            (N, 3, H, W) float pixels, cut into patch x patch tiles row by row
      transcribe/
        audio.npy           features: (N, tokens, features) float
        text.npy
      regress/
        target.npy          an mse task's target: (N, out_tokens, out_width) float
                            (several sinks: target.MODULE.npy each)

Optional, beside a token-id or feature modality's array (``masks.py`` says what they do):

        text.len.npy        (N,) integers: each row's real tokens, the rest being padding
        text.labels.npy     (N, tokens) integers: the targets an lm loss scores, aligned with
                            the ids (position i predicts labels[i + 1]); -100 scores nothing

Every array of a folder has the same N, one row per sample, and ``tokens`` may be more than a
task reads (it reads a prefix, as ``text[8]`` does). The arrays are memory-mapped, so a step
reads only the rows of its batch: a folder larger than memory trains as well as a small one.
Sample ``i`` of a folder is row ``i mod N``: the runtime asks for the rows at the task's
global sample positions, so what a step reads is a pure function of the step (resumable,
whatever the plan and the number of ranks). Shuffle when writing if the order matters.

A ``"package.module:function"`` names a function returning any dataset of dicts keyed by
modality (see ``data.py``); it is imported and called in each process that reads it.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spindle_dsl.errors import ExecutionError

from .masks import IGNORE, LABELS, LEN
from .needs import InputNeed, TargetNeed

TARGET = "target"


def target_file(sink: str, targets: Sequence[TargetNeed]) -> str:
    """``target.npy`` for an mse task's only sink, ``target.MODULE.npy`` for one of several."""
    if len(targets) == 1:
        return f"{TARGET}.npy"
    return f"{TARGET}.{sink.partition('/')[2]}.npy"


def _patch_side(need: InputNeed) -> int:
    return math.isqrt(need.width // 3)


def _expected(need: InputNeed) -> str:
    if need.form == "vocab":
        return f"(N, >={need.tokens}) integer token ids"
    if need.form == "features":
        return f"(N, >={need.tokens}, {need.width}) float"
    p = _patch_side(need)
    return (
        f"(N, >={need.tokens}, {need.width}) float patches or (N, 3, H, W) float pixels "
        f"with at least {need.tokens} {p}x{p} patches"
    )


def _check_array(path: Path, need: InputNeed, arr: np.ndarray) -> str | None:
    """Why ``arr`` (memory-mapped from ``path``) cannot feed ``need``, or None."""
    shape, kind = tuple(arr.shape), arr.dtype.kind
    if need.form == "vocab":
        if kind not in "iu":
            return f"dtype {arr.dtype}: token ids must be integers"
        ok = len(shape) == 2 and shape[1] >= need.tokens
    else:
        if kind != "f":
            hint = " (pixels: x.astype('float32') / 255)" if kind in "iu" else ""
            return f"dtype {arr.dtype}: expected a float array{hint}"
        ok = len(shape) == 3 and shape[1] >= need.tokens and shape[2] == need.width
        if need.form == "image" and len(shape) == 4:
            p = _patch_side(need)
            ok = (
                shape[1] == 3
                and shape[2] % p == 0
                and shape[3] % p == 0
                and (shape[2] // p) * (shape[3] // p) >= need.tokens
            )
    return None if ok else f"expected {_expected(need)}, found shape {shape}"


def patchify(pixels: np.ndarray, side: int) -> np.ndarray:
    """(k, 3, H, W) pixels -> (k, (H/side)(W/side), 3 side side) patches, row-major tiles, each
    tile flattened channel first (as a vit's linear input stage reads them)."""
    k, c, h, w = pixels.shape
    tiles = pixels.reshape(k, c, h // side, side, w // side, side)
    return tiles.transpose(0, 2, 4, 1, 3, 5).reshape(k, (h // side) * (w // side), c * side**2)


class NpyFolder(torch.utils.data.Dataset):
    """One task's folder of ``.npy`` arrays (see the module docstring), checked on opening
    against what the task reads; picklable (a process re-opens the memory maps it reads)."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        task: str,
        needs: Mapping[str, InputNeed],
        targets: Sequence[TargetNeed] = (),
    ):
        self.folder, self.task = Path(folder), task
        self.needs, self.targets = dict(needs), tuple(targets)
        self._arrays: dict[str, np.ndarray] | None = None
        self.length = self._check()

    def files(self) -> dict[str, Path]:
        """Key (modality, ``target:SINK``, or the optional ``len:NAME``/``labels:NAME``) ->
        the file that holds it."""
        out = {name: self.folder / f"{name}.npy" for name in self.needs}
        for t in self.targets:
            out[f"target:{t.sink}"] = self.folder / target_file(t.sink, self.targets)
        for name in self.needs:
            for prefix, suffix in ((LEN, "len"), (LABELS, "labels")):
                extra = self.folder / f"{name}.{suffix}.npy"
                if extra.is_file():
                    out[f"{prefix}{name}"] = extra
        return out

    @property
    def extras(self) -> frozenset[str]:
        """The ``len:``/``labels:`` keys this folder gives."""
        return frozenset(k for k in self.files() if k.startswith((LEN, LABELS)))

    def _check(self) -> int:
        if not self.folder.is_dir():
            what = "is a file, not a folder" if self.folder.exists() else "does not exist"
            raise ExecutionError(f"data of task {self.task}: {self.folder} {what}")
        problems, lengths = [], {}
        present = sorted(p.name for p in self.folder.glob("*.npy"))
        for key, path in self.files().items():
            if not path.is_file():
                problems.append(f"{path.name} is missing (the folder has: "
                                f"{', '.join(present) or 'no .npy file'})")  # fmt: skip
                continue
            try:
                arr = np.load(path, mmap_mode="r")
            except (OSError, ValueError) as exc:
                problems.append(f"{path}: not a readable .npy array ({exc})")
                continue
            why = self._check_one(key, path, arr)
            if why:
                problems.append(f"{path}, {self._what(key)}: {why}")
            lengths[path.name] = len(arr)
        if len(set(lengths.values())) > 1:
            sizes = ", ".join(f"{n} has {k}" for n, k in sorted(lengths.items()))
            problems.append(f"the arrays differ in their number of samples: {sizes}")
        if not problems and not next(iter(lengths.values()), 0):
            problems.append("the arrays hold no sample")
        if problems:
            raise ExecutionError(
                f"data of task {self.task} in {self.folder}:\n  " + "\n  ".join(problems)
            )
        return next(iter(lengths.values()))

    def _what(self, key: str) -> str:
        if key.startswith((LEN, LABELS)):
            return f"{key.partition(':')[0]} of modality {key.partition(':')[2]}"
        return f"target of {key[7:]}" if key.startswith("target:") else f"modality {key}"

    def _check_one(self, key: str, path: Path, arr: np.ndarray) -> str | None:
        if key in self.needs:
            return _check_array(path, self.needs[key], arr)
        if key.startswith((LEN, LABELS)):
            return check_extra(key, self.needs[key.partition(":")[2]], arr)
        shape = next(t.shape for t in self.targets if f"target:{t.sink}" == key)
        if arr.dtype.kind != "f":
            return f"dtype {arr.dtype}: expected a float array"
        if tuple(arr.shape[1:]) != shape:
            return f"expected (N, {shape[0]}, {shape[1]}) float, found shape {tuple(arr.shape)}"
        return None

    def _open(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            self._arrays = {k: np.load(p, mmap_mode="r") for k, p in self.files().items()}
        return self._arrays

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": None}  # memory maps do not travel; reopen them

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.take([index]).items()}

    def take(
        self, indices: Sequence[int], keys: frozenset[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """The samples at ``indices`` (each in [0, N)), stacked per key (only ``keys``, where
        given): token ids to (k, tokens) int64, the rest to (k, tokens, width) as stored, row
        lengths to (k,) and labels to (k, tokens) int64; one read per array."""
        arrays, rows = self._open(), np.asarray(indices, dtype=np.int64)
        out: dict[str, torch.Tensor] = {}
        for key, arr in arrays.items():
            if keys is not None and key not in keys:
                continue
            chunk = np.asarray(arr[rows])
            if key.startswith((LEN, LABELS)):
                out[key] = torch.from_numpy(self._extra(key, chunk))
                continue
            need = self.needs.get(key)
            if need is not None and need.form == "image" and chunk.ndim == 4:
                chunk = patchify(chunk, _patch_side(need))
            if need is not None:
                chunk = chunk[:, : need.tokens]
            if need is not None and need.form == "vocab":
                chunk = chunk.astype(np.int64)
                if len(chunk) and (chunk.min() < 0 or chunk.max() >= need.width):
                    bad = int(rows[np.nonzero((chunk < 0) | (chunk >= need.width))[0][0]])
                    raise ExecutionError(
                        f"data of task {self.task}: {self.files()[key]}, sample {bad}: token "
                        f"ids must lie in [0, {need.width}) (the vocab of modality {key})"
                    )
            out[key] = torch.from_numpy(np.ascontiguousarray(chunk))
        return out

    def _extra(self, key: str, chunk: np.ndarray) -> np.ndarray:
        """Row lengths clamped to the tokens the task reads; labels cut to them."""
        need = self.needs[key.partition(":")[2]]
        chunk = chunk.astype(np.int64)
        if key.startswith(LABELS):
            chunk = chunk[:, : need.tokens]
        problem = extra_problem(key, need, chunk)
        if problem:
            raise ExecutionError(f"data of task {self.task}: {self.files()[key]}: {problem}")
        if key.startswith(LEN):
            return np.ascontiguousarray(np.minimum(chunk, need.tokens))
        return np.ascontiguousarray(chunk)


def check_extra(key: str, need: InputNeed, arr: np.ndarray) -> str | None:
    """Why ``arr`` cannot be the row lengths (``len:``) or labels (``labels:``) of ``need``'s
    modality, or None."""
    if arr.dtype.kind not in "iu":
        return f"dtype {arr.dtype}: expected integers"
    if key.startswith(LEN):
        if need.form == "image":
            return "image rows have no lengths: a vit reads every patch"
        return None if arr.ndim == 1 else f"expected (N,) lengths, found shape {tuple(arr.shape)}"
    if need.form != "vocab":
        return "labels are for a token-id modality"
    if arr.ndim != 2 or arr.shape[1] < need.tokens:
        return f"expected (N, >={need.tokens}) labels, found shape {tuple(arr.shape)}"
    return None


def extra_problem(key: str, need: InputNeed, chunk: np.ndarray) -> str | None:
    """Why rows of lengths or labels (read, as integers) are wrong, or None (the values are
    checked as they are read, like token ids, so a large file opens at once)."""
    if key.startswith(LEN):
        return "a row length is negative" if len(chunk) and chunk.min() < 0 else None
    wrong = (chunk != IGNORE) & ((chunk < 0) | (chunk >= need.width))
    return f"labels must lie in [0, {need.width}) or be {IGNORE}" if wrong.any() else None


class ReferenceSource(torch.utils.data.Dataset):
    """``"package.module:function"``: the dataset the function returns, made in each process
    on first use (only the reference is pickled to workers)."""

    def __init__(self, reference: str, task: str):
        self.reference, self.task = reference, task
        self._dataset: Any = None

    def dataset(self) -> Any:
        if self._dataset is None:
            module_name, _, function = self.reference.partition(":")
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:  # the user's module may raise anything while importing
                raise ExecutionError(
                    f"data of task {self.task}: cannot import {module_name} "
                    f"({type(exc).__name__}: {exc})"
                ) from None
            make = getattr(module, function, None)
            if not callable(make):
                raise ExecutionError(
                    f"data of task {self.task}: {module_name} has no function {function}"
                )
            dataset = make()
            if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
                raise ExecutionError(
                    f"data of task {self.task}: {self.reference}() returned "
                    f"{type(dataset).__name__}, not a dataset (__len__ and __getitem__)"
                )
            self._dataset = dataset
        return self._dataset

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_dataset": None}

    def __len__(self) -> int:
        return len(self.dataset())

    def __getitem__(self, index: int) -> Any:
        return self.dataset()[index]


def open_source(
    spec: str | os.PathLike[str],
    task: str,
    needs: Mapping[str, InputNeed],
    targets: Sequence[TargetNeed] = (),
) -> torch.utils.data.Dataset:
    """A folder (``NpyFolder``) or a ``package.module:function`` (``ReferenceSource``)."""
    from spindle_dsl.language.files import is_reference  # the language only where it is needed

    text = os.fspath(spec)
    if is_reference(text) and not os.path.exists(text):
        return ReferenceSource(text, task)
    return NpyFolder(text, task, needs, targets)


def write_task_folder(folder: str | os.PathLike[str], arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``NAME.npy`` for each array into ``folder``, each file atomically (a temporary
    file beside it, then a rename), so a reader never meets half an array."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        final = folder / f"{name}.npy"
        tmp = folder / f".{name}.npy.tmp"
        try:
            with open(tmp, "wb") as fh:
                np.save(fh, np.ascontiguousarray(arr), allow_pickle=False)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
