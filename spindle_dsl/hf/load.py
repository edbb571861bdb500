"""A module's parameters from a Hugging Face folder: ``model.safetensors``, or the shards that
``model.safetensors.index.json`` lists.

``module_rules`` turns a module of the MetaGraph into its tensor rules (``mapping.Rules``): the
folder's config picks the family, the module's arguments and its raw input stage give the
shapes, and the file's keys say under which prefix they sit (``model.`` in a
``LlamaForCausalLM`` file, none in a bare ``LlamaModel``'s). ``load_part`` then fills one part
(a layer, an input stage, the head) reading only that part's tensors, each from the shard that
holds it, so a rank holding three layers of a 7B model reads three layers. ``problems`` checks
a module's parts against the files' headers before anything trains and lists every missing or
mis-shaped tensor. A part with no counterpart in the architecture (a second input stage) keeps
its seeded initialisation; tensors of the file that the module does not use are left alone.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

from spindle_dsl.errors import ExecutionError
from spindle_dsl.hf.config import HfModel, resolve
from spindle_dsl.hf.files import weight_map
from spindle_dsl.hf.mapping import HfError, Rules, Stage, TensorRule
from spindle_dsl.metagraph import MetaGraph, ModuleInfo

_FORM = {"vit": "image", "transformer": None}  # the form of the stage a family reads


def stage_of(graph: MetaGraph, info: ModuleInfo, model: HfModel) -> Stage | None:
    """The module's one raw input stage the architecture has: the token ids of a language
    model or text tower, an image for a vision tower, mel frames for Whisper."""
    wanted = "features" if model.family.name == "whisper" else _FORM[model.kind] or "vocab"
    for name, tokens in info.raw_inputs:
        m = graph.modality(name)
        form = "vocab" if m.vocab is not None else "features" if m.features else "image"
        if form == wanted:
            return Stage(f"input.{name}", tokens, m.vocab, m.features)
    return None


def module_rules(graph: MetaGraph, module: str, keys: Iterable[str] | None = None) -> Rules:
    """Every tensor rule of ``module`` (from its ``hf`` folder, or its ``from`` folder),
    under the prefix the folder's files use (``keys``: those files' tensor names; default:
    read from the folder)."""
    info = graph.module(module)
    folder = info.weights if info.weights and os.path.isdir(info.weights) else info.hf
    if folder is None:
        raise ExecutionError(f"module {module} has no Hugging Face folder")
    try:
        model = resolve(folder, kind=info.kind)
        names = set(keys) if keys is not None else set(_weight_map(folder))
    except HfError as exc:
        raise ExecutionError(f"module {module}: {exc}") from None
    args = dict(info.args)
    stage = stage_of(graph, info, model)
    anchor = model.family.anchor(args)
    prefix = next((p for p in model.family.prefixes if p + anchor in names), None)
    if prefix is None:
        tried = ", ".join(repr(p + anchor) for p in model.family.prefixes)
        raise ExecutionError(
            f"{folder} does not hold a {model.model_type} model's tensors (looked for {tried})"
        )
    return model.family.rules(args, stage, prefix)


def _weight_map(folder: str) -> dict[str, str]:
    index = os.path.join(folder, "model.safetensors.index.json")
    target = index if os.path.isfile(index) else os.path.join(folder, "model.safetensors")
    stat = os.stat(target)
    return _cached_map(folder, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _cached_map(folder: str, mtime_ns: int, size: int) -> dict[str, str]:
    return weight_map(folder)


def part_rules(rules: Rules, role: str) -> list[TensorRule]:
    """The rules that fill part ``role`` (``layer.3``, ``input.text``, ``head``)."""
    return rules.for_role(role)


def problems(graph: MetaGraph, module: str, roles: Iterable[str], shapes: dict) -> list[str]:
    """What is missing from the folder or of the wrong shape for ``module``'s parts
    ``roles`` (``shapes``: ``ROLE.PARAM`` -> our shape), from the files' headers only."""
    from spindle_dsl.backends.torch.weights import read_header

    info = graph.module(module)
    folder = info.weights
    assert folder is not None and os.path.isdir(folder)
    try:
        where = _weight_map(folder)
    except HfError as exc:
        return [str(exc)]
    rules = module_rules(graph, module, where)
    missing, wrong, unmapped = [], [], []
    for role in roles:
        mine = {k: v for k, v in shapes.items() if k.startswith(role + ".")}
        found = part_rules(rules, role)
        if not found:
            continue  # no counterpart: seeded
        covered = {r.ours for r in found}
        unmapped += sorted(set(mine) - covered)
        for r in found:
            for key, shape in zip(r.theirs, r.shapes, strict=True):
                if key not in where:
                    missing.append(key)
                    continue
                have = read_header(where[key])[key][0]
                if tuple(have) != tuple(shape):
                    wrong.append(f"{key}: the file has {list(have)}, the model {list(shape)}")
    out = []
    if missing:
        out.append(f"missing {len(missing)} tensor(s): {', '.join(missing[:8])}")
    if wrong:
        out.append(f"{len(wrong)} of the wrong shape: {'; '.join(wrong[:8])}")
    if unmapped:
        out.append(f"no tensor of the folder fills {', '.join(unmapped[:8])}")
    return out


def load_part(graph: MetaGraph, module: str, role: str, target) -> bool:
    """Copy part ``role`` of ``module`` from its folder into the torch module ``target``
    (cast to its dtype, on its device), reading only that part's tensors; False when the
    architecture has no counterpart for the part (it keeps its seeded values)."""
    import torch
    from safetensors import safe_open

    folder = graph.module(module).weights
    assert folder is not None
    where = _weight_map(folder)
    found = part_rules(module_rules(graph, module, where), role)
    if not found:
        return False
    params = dict(target.named_parameters())
    by_file: dict[str, list[str]] = {}
    for r in found:
        for key in r.theirs:
            if key not in where:
                raise ExecutionError(f"{folder} has no tensor {key} (module {module}, {role})")
            by_file.setdefault(where[key], []).append(key)
    tensors = {}
    for path, keys in by_file.items():
        with safe_open(path, framework="pt") as f:
            tensors.update((k, f.get_tensor(k)) for k in keys)
    for r in found:
        for key, shape in zip(r.theirs, r.shapes, strict=True):
            if tuple(tensors[key].shape) != tuple(shape):
                got = list(tensors[key].shape)
                raise ExecutionError(
                    f"{key} in {folder} is {got}; module {module} needs {list(shape)}"
                )
    with torch.no_grad():
        for r in found:
            name = r.ours[len(role) + 1 :]
            if name not in params:
                raise ExecutionError(f"{module}.{role} has no parameter {name} to load into")
            t = params[name]
            t.copy_(r.to_ours([tensors[k] for k in r.theirs], tuple(t.shape)).to(t.dtype))
    return True
