"""Read a Hugging Face folder's config.json into a kind and its arguments.

``resolve(folder, tower=..., kind=...)`` reads only ``FOLDER/config.json`` (no weights: a folder
holding just the config checks and plans), picks the architecture by ``model_type`` (and, for
a config holding two towers such as ``clip``, the tower), and returns an ``HfModel``: the kind,
its arguments, the config field behind each argument (for messages), and what the data must
agree with (``family.Limits``). Anything the project cannot honour is an ``HfError`` naming the
field and its value.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spindle_dsl.hf.family import Family, Limits
from spindle_dsl.hf.llama import Llama, Mistral, Qwen2
from spindle_dsl.hf.mapping import HfError, show
from spindle_dsl.hf.towers import ClipText, ClipVision, SiglipVision, ViT, WhisperEncoder

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Llama(),
        Mistral(),
        Qwen2(),
        ViT(),
        ClipVision(),
        ClipText(),
        SiglipVision(),
        WhisperEncoder(),
    )
}
# model types that hold two towers: tower -> (the config key holding it, its model_type)
COMPOSITE: dict[str, dict[str, tuple[str, str]]] = {
    "clip": {
        "vision": ("vision_config", "clip_vision_model"),
        "text": ("text_config", "clip_text_model"),
    },
    "siglip": {"vision": ("vision_config", "siglip_vision_model")},
}
TOWER_OF_KIND = {"vit": "vision", "transformer": "text"}
SUPPORTED = tuple(sorted({*FAMILIES, *COMPOSITE}))


@dataclass(frozen=True)
class HfModel:
    """A folder's config resolved to a kind (see the module docstring)."""

    folder: str
    family: Family
    tower: str | None  # the tower of a config that holds two ("vision", "text"), else None
    config: Mapping[str, Any]  # the tower's config (all of config.json for one model)
    source: Mapping[str, Any] = field(repr=False)  # the whole config.json
    args: Mapping[str, Any] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)

    @property
    def kind(self) -> str:
        return self.family.kind

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", self.family.model_type))

    def field_of(self, arg: str) -> str | None:
        """The config field an argument comes from; None for a structural default (which a
        spec may override) or an argument the architecture fixes."""
        return self.family.table.key_of(arg)

    def fixed(self, arg: str) -> bool:
        """Whether the architecture fixes ``arg`` (no config field, no override)."""
        return arg in self.family.table.args and self.field_of(arg) is None

    def describe(self, arg: str) -> str:
        """Where ``arg``'s value comes from, for a message."""
        key = self.field_of(arg)
        if key is None:
            return f"{self.model_type} fixes {arg} = {self.args.get(arg)!r}"
        value = self.family.flat(self.config).get(key)
        return f"config.json has {key} = {show(value)}"


def config_path(folder: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(folder), "config.json")


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``FOLDER/config.json`` as a dict; a missing folder or file or bad JSON is an
    ``HfError``."""
    path = config_path(folder)
    if not os.path.isdir(folder):
        raise HfError(f"{folder} is not a folder")
    stat = _stat(path)
    return dict(_read(path, *stat))


def _stat(path: str) -> tuple[int, int]:
    try:
        s = os.stat(path)
    except OSError:
        raise HfError(
            f"{path} does not exist (a Hugging Face folder holds a config.json)"
        ) from None
    return s.st_mtime_ns, s.st_size


@functools.lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HfError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HfError(f"{path} does not hold a JSON object")
    return data


def resolve(
    folder: str | os.PathLike[str],
    *,
    tower: str | None = None,
    kind: str | None = None,
    hint: str | None = None,
) -> HfModel:
    """The kind and arguments of the model in ``folder`` (see the module docstring).
    ``tower`` picks one tower of a two-tower config; without it the tower follows ``kind``,
    which the model must be, or else ``hint`` (the kind its data suggests): a vit reads the
    vision tower, a transformer the text tower."""
    source = read_config(folder)
    model_type = source.get("model_type")
    if not isinstance(model_type, str):
        raise HfError("config.json has no model_type", "model_type")
    config, model_type, tower = _tower(source, model_type, tower, kind or hint)
    family = FAMILIES.get(model_type)
    if family is None:
        raise HfError(
            f'model_type = "{model_type}" is not supported (supported: {", ".join(SUPPORTED)})',
            "model_type",
        )
    if kind is not None and kind != family.kind:
        raise HfError(f'model_type = "{model_type}" is a {family.kind}, not a {kind}')
    config = {**family.config_defaults, **config}
    return HfModel(
        folder=os.fspath(folder),
        family=family,
        tower=tower,
        config=config,
        source=source,
        args=family.args(config),
        limits=family.limits(family.flat(config)),
    )


def _tower(
    source: dict[str, Any], model_type: str, tower: str | None, kind: str | None
) -> tuple[dict[str, Any], str, str | None]:
    """(the tower's config, its model_type, the tower) of a config."""
    towers = COMPOSITE.get(model_type)
    if towers is None:
        if tower not in (None, "encoder" if model_type == "whisper" else None):
            raise HfError(f'model_type = "{model_type}" has one tower; drop tower = "{tower}"')
        return source, model_type, None
    if tower is None and kind is not None:
        tower = TOWER_OF_KIND.get(kind)
    if tower not in towers:
        listed = " or ".join(f'"{t}"' for t in towers)
        raise HfError(f'model_type = "{model_type}" holds towers {listed}; say which: tower = ...')
    key, sub_type = towers[tower]
    sub = source.get(key)
    if not isinstance(sub, dict):
        raise HfError(f"config.json has no {key}", key)
    return {**sub, "model_type": sub_type}, sub_type, tower
