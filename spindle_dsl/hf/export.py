"""Modules out as Hugging Face folders (``spindle export --format hf``).

Each module becomes a folder with ``config.json`` and ``model.safetensors`` that transformers'
``from_pretrained`` loads with no missing or unexpected keys: the architecture is the module's
``hf`` folder's, else the first family whose config table can hold the module's arguments
and whose config reads back to exactly those arguments (``family.Family.config`` and
``args``, the same tables the import reads), so an export cannot write what an import would
read differently. Tensors go through the same rules as the import, split and reshaped the
other way. A module that came from a folder keeps that config's other fields (token ids, the
tokenizer's limits), and what the spec did not train or hold (a Whisper decoder, an LM head no
task used) is copied from the folder's own weights unchanged.

A module no architecture can hold (an adapter, a model with options transformers lacks) keeps
the project's format beside the others: ``MODULE/weights.safetensors`` with ``MODULE.ROLE.PARAM``
keys, which a ``from`` clause reads back. Every file is written atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spindle_dsl.atomic import write_atomic
from spindle_dsl.errors import ExecutionError
from spindle_dsl.hf.config import FAMILIES, resolve
from spindle_dsl.hf.family import Family
from spindle_dsl.hf.load import module_rules, stage_of
from spindle_dsl.hf.mapping import HfError, NotExpressible, Rules, Stage
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph, ModuleInfo

# what a spec chooses about a module's output, not its architecture: left out of the
# round-trip comparison
_OUTPUT_ARGS = frozenset({"output", "out_tokens"})


@dataclass(frozen=True)
class ModuleExport:
    """One module written: where, as what, and (for the project's format) why."""

    module: str
    folder: str
    model_type: str | None  # None: the project's format
    tensors: int
    params: int
    note: str = ""


def _round_trips(family: Family, info: ModuleInfo, config: dict[str, Any]) -> str | None:
    """Why ``config`` would not read back as ``info``'s arguments (None: it does)."""
    kind = get_kind(info.kind)
    try:
        back = kind.resolve({**family.args(config), **_chosen(info)})
    except HfError as exc:
        return str(exc)
    mine = dict(info.args)
    wrong = sorted(k for k in set(back) | set(mine) if back.get(k) != mine.get(k))
    if wrong:
        shown = ", ".join(f"{k} = {mine.get(k)!r}" for k in wrong[:4])
        return f"{family.model_type} cannot hold {shown}"
    return None


def _chosen(info: ModuleInfo) -> dict[str, Any]:
    return {k: v for k, v in info.args if k in _OUTPUT_ARGS}


def choose(graph: MetaGraph, module: str) -> tuple[Family, dict[str, Any], Stage | None]:
    """The family a module exports as, its config.json, and its raw input stage; raises
    ``NotExpressible`` saying why none fits."""
    info = graph.module(module)
    args = dict(info.args)
    if info.hf is not None:
        model = resolve(info.hf, kind=info.kind)
        candidates: list[tuple[Family, Mapping[str, Any]]] = [(model.family, model.config)]
    else:
        candidates = [(f, {}) for f in FAMILIES.values() if f.kind == info.kind]
    reasons = []
    for family, base in candidates:
        model_stage = stage_of(graph, info, _Probe(family))
        if model_stage is None:  # every architecture starts with its input stage
            reasons.append(f"{family.model_type}: it reads no raw input its embedding would take")
            continue
        try:
            fields = family.config(args, model_stage)
        except NotExpressible as exc:
            reasons.append(f"{family.model_type}: {exc}")
            continue
        config = {**base, **fields}
        config.update(model_type=family.model_type, architectures=[family.architecture])
        why = _round_trips(family, info, config)
        if why is None:
            return family, config, model_stage
        reasons.append(why)
    raise NotExpressible("; ".join(reasons) or f"no architecture is a {info.kind}")


@dataclass(frozen=True)
class _Probe:
    """What ``stage_of`` asks of a model: its family and kind."""

    family: Family

    @property
    def kind(self) -> str:
        return self.family.kind


def hf_tensors(
    graph: MetaGraph,
    module: str,
    family: Family,
    stage: Stage | None,
    ours: Mapping[str, Any],
) -> tuple[dict[str, Any], list[str]]:
    """(their tensors by key, our parameters no rule wrote) for ``module``: every rule's
    tensors from ours, or from the module's source folder where ours lacks them."""
    info = graph.module(module)
    source = _source_rules(graph, module)
    carry = family.carries and source is not None  # the source's layout, the rest kept
    prefix = source[0].prefix if carry else family.export_prefix  # type: ignore[index]
    rules = family.rules(dict(info.args), stage, prefix)
    out: dict[str, Any] = {}
    for rule in rules.rules:
        if rule.ours in ours:
            pieces = rule.to_theirs(ours[rule.ours])
        elif source is not None and rule.ours in source[0].by_ours():
            pieces = _read(source[1], source[0].by_ours()[rule.ours].theirs)
        else:
            raise NotExpressible(
                f"it holds no {rule.ours} (no task trains that part) for {rule.theirs[0]}"
            )
        out.update(zip(rule.theirs, pieces, strict=True))
    used = {r.ours for r in rules.rules}
    if carry:  # the rest of the model as the folder holds it (Whisper's decoder)
        assert source is not None
        rest = [k for k in source[1] if k not in out]
        out.update(zip(rest, _read(source[1], rest), strict=True))
    return out, sorted(set(ours) - used)


def _source_rules(graph: MetaGraph, module: str) -> tuple[Rules, dict[str, str]] | None:
    """The rules and files of the folder the module came from, when it holds weights."""
    from spindle_dsl.hf.files import has_weights, weight_map

    info = graph.module(module)
    if info.hf is None or not has_weights(info.hf):
        return None
    where = weight_map(info.hf)
    return module_rules(graph, module, where), where


def _read(where: Mapping[str, str], keys) -> list[Any]:
    from safetensors import safe_open

    out = []
    for key in keys:
        with safe_open(where[key], framework="pt") as f:
            out.append(f.get_tensor(key))
    return out


def export_module(
    graph: MetaGraph, module: str, folder: str | os.PathLike[str], tensors: Mapping[str, Any]
) -> ModuleExport:
    """Write ``module`` (its parameters among ``tensors``, keyed ``MODULE.ROLE.PARAM``) into
    ``folder``: as a Hugging Face folder where an architecture holds it, else in the project's
    format (see the module docstring)."""
    from spindle_dsl.backends.torch.weights import write_safetensors

    prefix = f"{module}."
    ours = {k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)}
    folder = Path(folder)
    try:
        family, config, stage = choose(graph, module)
        theirs, left = hf_tensors(graph, module, family, stage, ours)
    except (NotExpressible, HfError) as exc:
        flat = {f"{prefix}{k}": t.contiguous() for k, t in ours.items()}
        write_safetensors(folder / "weights.safetensors", flat, {"format": "pt"})
        return ModuleExport(module, str(folder), None, len(flat), _count(flat), str(exc))
    note = ""
    if family.carries and info_source(graph, module) is None:
        note = f"{family.architecture} also holds a decoder, which this folder lacks"
    if left:
        extra = {f"{prefix}{k}": ours[k].contiguous() for k in left}
        write_safetensors(folder / "spindle.safetensors", extra, {"format": "pt"})
        note += f"; {len(left)} tensors with no counterpart in spindle.safetensors"
        note = note.removeprefix("; ")
    if family.carries and info_source(graph, module) is not None:
        config["architectures"] = info_source(graph, module)["architectures"]
    dtypes = {str(t.dtype).removeprefix("torch.") for t in theirs.values()}
    config["torch_dtype"] = dtypes.pop() if len(dtypes) == 1 else "float32"
    write_atomic(folder / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    flat = {k: t.contiguous() for k, t in theirs.items()}
    write_safetensors(folder / "model.safetensors", flat, {"format": "pt"})
    return ModuleExport(module, str(folder), family.model_type, len(flat), _count(flat), note)


def info_source(graph: MetaGraph, module: str) -> dict[str, Any] | None:
    """The config.json of the folder a module came from, when that folder holds weights."""
    from spindle_dsl.hf.files import has_weights

    folder = graph.module(module).hf
    if folder is None or not has_weights(folder):
        return None
    return resolve(folder, kind=graph.module(module).kind).source  # type: ignore[return-value]


def _count(tensors: Mapping[str, Any]) -> int:
    return sum(t.numel() for t in tensors.values())


def export_folders(
    graph: MetaGraph,
    out: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    module: str | None = None,
) -> list[ModuleExport]:
    """Every module as ``OUT/MODULE/`` (or the one named, as ``OUT`` itself)."""
    names = [m.name for m in graph.modules]
    if module is not None and module not in names:
        raise ExecutionError(f"the spec has no module {module!r} (it has {', '.join(names)})")
    if module is not None:
        return [export_module(graph, module, out, tensors)]
    return [export_module(graph, name, Path(out) / name, tensors) for name in names]
