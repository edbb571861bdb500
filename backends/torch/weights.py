"""Pretrained weights in: a module's parameters from a safetensors file (``from "w.safetensors"``),
or from a Hugging Face folder (``hf("DIR")``, ``from "DIR"``: ``spindle_dsl.hf.load`` maps its
tensor names and layouts to ours, reading per part just the same).

Keys are ``MODULE.ROLE.PARAM``, one per parameter of every part, as ``spindle export`` writes
them: ``lm.layer.0.qkv.weight``, ``lm.input.text.embed.weight``, ``lm.head.ln.weight``. A file
holding one module's keys without the module prefix (``layer.0.qkv.weight``) works too: a file
with no key under ``MODULE.`` is read that way.

Each process reads only the tensors of the parts it builds (safetensors reads single tensors
from a memory map), so a rank holding three layers of a 7B model reads three layers. Before
anything trains, ``check_weights`` compares every key and shape a module's file must have with
the file's header (no tensor is read) and lists what is missing, extra or of the wrong shape.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph

from .parts import Part

Header = dict[str, tuple[tuple[int, ...], str]]  # key -> (shape, safetensors dtype)
_SHOWN = 8  # keys listed per kind of problem before "... and N more"


def flat_key(part: Part, name: str) -> str:
    """The file key of parameter ``name`` of ``part``."""
    return f"{part.module}.{part.role}.{name}"


def read_header(path: str | os.PathLike[str]) -> Header:
    """Every key of a safetensors file with its shape and dtype; reads the header only."""
    stat = os.stat(path)
    return _header(os.fspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _header(path: str, mtime_ns: int, size: int) -> Header:
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return {
                k: (tuple(f.get_slice(k).get_shape()), str(f.get_slice(k).get_dtype()))
                for k in f.keys()  # noqa: SIM118 (a safe_open handle is not a dict)
            }
    except Exception as exc:  # safetensors raises its own error types for a bad file
        raise ExecutionError(f"{path} is not a readable safetensors file: {exc}") from None


def module_prefix(header: Header, module: str) -> str:
    """``MODULE.`` where the file has keys under it, else "" (a one-module file)."""
    prefix = f"{module}."
    return prefix if any(k.startswith(prefix) for k in header) else ""


def load_part(path: str, part: Part, module: nn.Module) -> None:
    """Copy ``part``'s parameters from the file at ``path`` into ``module`` (cast to its
    dtype, on its device), reading only those tensors."""
    from safetensors import safe_open

    header = read_header(path)
    prefix = module_prefix(header, part.module)
    params = dict(module.named_parameters())
    problems = compare_keys(
        {f"{prefix}{part.role}.{n}": tuple(t.shape) for n, t in params.items()},
        {k: v for k, v in header.items() if k.startswith(f"{prefix}{part.role}.")},
    )
    if problems:
        raise ExecutionError(f"weights of {part.key} in {path}:\n  " + "\n  ".join(problems))
    with safe_open(path, framework="pt") as f, torch.no_grad():
        for name, t in params.items():
            t.copy_(f.get_tensor(f"{prefix}{part.role}.{name}").to(dtype=t.dtype))


def expected_shapes(graph: MetaGraph, parts: Iterable[Part]) -> dict[str, tuple[int, ...]]:
    """``flat_key -> shape`` of every parameter of ``parts``, from the kinds' layers built on
    the meta device (no memory, no initialisation)."""
    from .params import construct_part

    out: dict[str, tuple[int, ...]] = {}
    with torch.device("meta"):
        for part in parts:
            for name, t in construct_part(graph, part).named_parameters():
                out[flat_key(part, name)] = tuple(t.shape)
    return out


def check_weights(graph: MetaGraph, parts: Iterable[Part]) -> None:
    """Every module with a ``from`` file must find in it exactly its parts' parameters, each
    of its shape; one error lists every problem of every module."""
    parts = tuple(parts)
    problems: list[str] = []
    for info in graph.modules:
        if not info.weights:
            continue
        mine = [p for p in parts if p.module == info.name]
        if not mine:
            continue
        if os.path.isdir(info.weights):  # a Hugging Face folder: its own names and layout
            from spindle_dsl.hf.load import problems as hf_problems

            shapes = {k.partition(".")[2]: v for k, v in expected_shapes(graph, mine).items()}
            found = hf_problems(graph, info.name, sorted({p.role for p in mine}), shapes)
            if found:
                problems.append(f"module {info.name} from {info.weights}:")
                problems.extend(f"  {p}" for p in found)
            continue
        header = read_header(info.weights)
        prefix = module_prefix(header, info.name)
        want = {prefix + k.partition(".")[2]: v for k, v in expected_shapes(graph, mine).items()}
        have = {k: v for k, v in header.items() if k.startswith(prefix)}
        found = compare_keys(want, have)
        if found:
            problems.append(f"module {info.name} from {info.weights}:")
            problems.extend(f"  {p}" for p in found)
    if problems:
        raise ExecutionError("pretrained weights do not fit the model:\n  " + "\n  ".join(problems))


def compare_keys(want: dict[str, tuple[int, ...]], have: Header) -> list[str]:
    """What is missing from ``have``, extra in it, or of another shape than ``want`` says."""
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    shapes = [
        f"{k}: the file has {list(have[k][0])}, the model {list(want[k])}"
        for k in sorted(set(want) & set(have))
        if tuple(have[k][0]) != tuple(want[k])
    ]
    out = []
    if missing:
        out.append(f"missing {len(missing)} key(s): {_listed(missing)}")
    if extra:
        out.append(f"{len(extra)} extra key(s), which no part of this spec has: {_listed(extra)}")
    if shapes:
        out.append(f"{len(shapes)} of the wrong shape: {_listed(shapes, sep='; ')}")
    return out


def _listed(items: list[str], sep: str = ", ") -> str:
    shown = sep.join(items[:_SHOWN])
    return shown + (f"{sep}... and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def write_safetensors(
    path: str | os.PathLike[str], tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    """Write ``tensors`` as a safetensors file atomically: a temporary file beside ``path``,
    fsynced, then renamed over it."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
