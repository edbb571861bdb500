"""The two tables each supported architecture is written as, and the rules that read them both
ways, so that importing and exporting a model cannot disagree.

- A ``ConfigTable`` pairs ``config.json`` fields with kind arguments (``Field``: a value, an
  enumeration such as ``hidden_act``, a default for an absent field) and fixes the arguments
  an architecture implies (``Fixed``: LLaMA blocks are RMSNorm, rotary and causal). Read one
  way it gives a kind's arguments; read the other way, the config fields of a module, or why
  the module is not that architecture.
- A ``TensorRule`` names one parameter of ours (``layer.3.qkv.weight``) and the Hugging Face
  tensors it is made of with their shapes. Ours is their concatenation along the first axis,
  reshaped to our shape (q, k and v into one fused projection; gate and up into one
  feed-forward matrix; a convolution kernel into a linear layer's matrix; a ``(1, 1, h)``
  token into a vector); theirs is ours reshaped and split again. Neither direction has a
  rule of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Config = Mapping[str, Any]
Shape = tuple[int, ...]


class HfError(Exception):
    """A config.json the project cannot honour. ``field`` names the config field at fault
    (None when the problem is the folder or file itself)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class NotExpressible(Exception):
    """Kind arguments that the architecture cannot express (export then keeps the project's
    format); the message says which argument and why."""


_ABSENT: Any = object()


def show(value: Any) -> str:
    """A config value as config.json writes it, for messages."""
    import json

    return json.dumps(value)


@dataclass(frozen=True)
class Field:
    """``config[key]`` <-> ``args[arg]``. ``choices`` maps config values to argument values
    (an enumeration; the first config value of an argument value is the one written back);
    ``default`` is the value an absent field means (``_ABSENT``: the field is required);
    ``type`` the JSON type the value must have."""

    key: str
    arg: str | tuple[str, ...]  # several: one field sets them all (Llama's attention_bias)
    type: type | tuple[type, ...] = (int, float, str, bool)
    default: Any = _ABSENT
    choices: Mapping[Any, Any] | None = None

    def read(self, cfg: Config) -> Any:
        """The argument value (None: an optional field that is absent or null)."""
        value = cfg.get(self.key, self.default)
        if value is None and self.default is None:
            return None
        if value is _ABSENT:
            raise HfError(f"config.json has no {self.key}", self.key)
        if self.choices is not None:
            if value not in self.choices:
                known = ", ".join(show(k) for k in self.choices)
                raise HfError(
                    f"{self.key} = {show(value)} is not supported (supported: {known})", self.key
                )
            return self.choices[value]
        wanted = self.type if isinstance(self.type, tuple) else (self.type,)
        if isinstance(value, bool) and bool not in wanted:
            value = None  # JSON true is not a number
        if not isinstance(value, wanted):
            raise HfError(f"{self.key} = {show(value)} must be a {wanted[0].__name__}", self.key)
        if float in wanted and int not in wanted:
            value = float(value)
        if wanted == (int,) and value < 1:
            raise HfError(f"{self.key} = {show(value)} must be at least 1", self.key)
        return value

    @property
    def names(self) -> tuple[str, ...]:
        return self.arg if isinstance(self.arg, tuple) else (self.arg,)

    def write(self, args: Mapping[str, Any]) -> tuple[str, Any]:
        values = {args.get(a) for a in self.names}
        if len(values) != 1:
            listed = ", ".join(f"{a} = {args.get(a)!r}" for a in self.names)
            raise NotExpressible(f"{self.key} is one setting, but {listed}")
        (value,) = values
        if value is None and self.default is None:
            return self.key, None
        if self.choices is not None:
            back = [k for k, v in self.choices.items() if v == value]
            if not back:
                raise NotExpressible(f"{self.arg} = {value!r} has no {self.key}")
            value = back[0]
        return self.key, value


@dataclass(frozen=True)
class Fixed:
    """An argument the architecture fixes: what import sets and export requires."""

    arg: str
    value: Any


@dataclass(frozen=True)
class ConfigTable:
    """One architecture's config fields and fixed arguments."""

    fields: tuple[Field | Fixed, ...]

    def to_args(self, cfg: Config) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self.fields:
            if isinstance(f, Fixed):
                out[f.arg] = f.value
            else:
                value = f.read(cfg)
                if value is not None:
                    out.update((a, value) for a in f.names)
        return out

    def to_config(self, args: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self.fields:
            if isinstance(f, Fixed):
                if args.get(f.arg) != f.value:
                    raise NotExpressible(f"it has {f.arg} = {args.get(f.arg)!r}, not {f.value!r}")
            else:
                key, value = f.write(args)
                if value is not None:
                    out[key] = value
        return out

    @property
    def args(self) -> tuple[str, ...]:
        """Every argument the table sets."""
        return tuple(
            a for f in self.fields for a in ((f.arg,) if isinstance(f, Fixed) else f.names)
        )

    def key_of(self, arg: str) -> str | None:
        """The config field an argument comes from (None for a fixed one)."""
        return next((f.key for f in self.fields if isinstance(f, Field) and arg in f.names), None)


@dataclass(frozen=True)
class TensorRule:
    """Our parameter ``ours`` (``ROLE.PARAM`` inside a module) is the Hugging Face tensors
    ``theirs`` (full keys) of ``shapes``, concatenated along their first axis and reshaped."""

    ours: str
    theirs: tuple[str, ...]
    shapes: tuple[Shape, ...]

    @property
    def stacked(self) -> Shape:
        """The shape of theirs concatenated (before the reshape to ours)."""
        first = self.shapes[0]
        return (sum(s[0] for s in self.shapes), *first[1:])

    def to_ours(self, tensors: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        import torch

        joined = tensors[0] if len(tensors) == 1 else torch.cat(list(tensors), dim=0)
        return joined.reshape(shape)

    def to_theirs(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        pieces = tensor.reshape(self.stacked).split([s[0] for s in self.shapes], dim=0)
        return [p.reshape(s).contiguous() for p, s in zip(pieces, self.shapes, strict=True)]


@dataclass(frozen=True)
class Stage:
    """The one raw input stage a Hugging Face model has: its part role (``input.image``) and
    the modality as the stage sees it."""

    role: str
    tokens: int
    vocab: int | None = None
    features: int | None = None


@dataclass(frozen=True)
class Rules:
    """Every tensor rule of one module, with the prefix its keys were made for."""

    rules: tuple[TensorRule, ...]
    prefix: str = ""
    ignored: tuple[str, ...] = field(default=())  # their keys the module does not use

    def by_ours(self) -> dict[str, TensorRule]:
        return {r.ours: r for r in self.rules}

    def for_role(self, role: str) -> list[TensorRule]:
        return [r for r in self.rules if r.ours.startswith(role + ".")]
