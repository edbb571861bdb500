"""The contract every module kind fulfils, and the registry that names them.

A kind is one place that knows everything about a layer type: the arguments a spec may give it,
how tokens and widths flow through it, what one layer costs (FLOPs, parameters, activations),
and the PyTorch modules that run it. The checker, the lowering, the cost model and the runtime
all ask the kind; none of them knows a kind by name. Users add kinds from Python with
``register_kind`` and use them in a spec at once.

Everything here is per sample and per layer unless a name says otherwise; ``args`` is always the
resolved argument mapping (every schema argument present, defaults filled in).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # torch is imported only by the methods that build layers
    from torch import nn

    from spindle_dsl.metagraph import ModalityInfo

ArgValue = int | float | bool | str
Args = Mapping[str, ArgValue]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class ArgSpec:
    """One argument of a kind: its type, its default, the least value it may take and, for a
    word, the values it may be.

    ``default`` is a value, ``REQUIRED``, ``None`` (optional, absent) or a function of the other
    resolved arguments (``ffn = 4 * hidden``; returning None leaves the argument absent).
    """

    name: str
    type: type
    default: ArgValue | Callable[[dict[str, Any]], ArgValue] | None = REQUIRED
    minimum: float | None = 1
    doc: str = ""
    choices: tuple[str, ...] | None = None  # the words a str argument may be


class Kind(ABC):
    """A layer type a spec can stack: ``NAME : KIND(layers = L, ...)``."""

    name: ClassVar[str]
    schema: ClassVar[tuple[ArgSpec, ...]]

    # --- arguments --------------------------------------------------------------------------
    def check_args(self, given: Args) -> list[tuple[str | None, str]]:
        """Problems with the given arguments as (argument name or None, message); empty if fine.

        Covers unknown names, missing required ones, wrong types and values below the minimum,
        plus any cross-argument rule of the kind (``hidden`` divisible by ``heads``...).
        """
        problems: list[tuple[str | None, str]] = []
        known = {a.name: a for a in self.schema}
        for key, value in given.items():
            spec = known.get(key)
            if spec is None:
                problems.append((key, f"{self.name}() takes no argument '{key}'"))
                continue
            if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, spec.type) or (spec.type is int and isinstance(value, bool)):
                problems.append(
                    (key, f"'{key}' of {self.name}() must be {spec.type.__name__}, got {value!r}")
                )
            elif spec.choices is not None and value not in spec.choices:
                listed = " or ".join(f'"{c}"' for c in spec.choices)
                problems.append((key, f"'{key}' of {self.name}() must be {listed}, got {value!r}"))
            elif (
                spec.minimum is not None and isinstance(value, int | float) and value < spec.minimum
            ):
                problems.append(
                    (
                        key,
                        f"'{key}' of {self.name}() must be at least {spec.minimum:g}, got {value}",
                    )
                )
        for spec in self.schema:
            if spec.default is REQUIRED and spec.name not in given:
                problems.append((None, f"{self.name}() needs '{spec.name}'"))
        if not problems:
            problems.extend((None, msg) for msg in self.check_resolved(self.resolve(given)))
        return problems

    def check_resolved(self, args: Args) -> list[str]:
        """Cross-argument rules on resolved arguments; override to add some."""
        return []

    def resolve(self, given: Args) -> dict[str, ArgValue]:
        """Fill defaults in schema order (a computed default sees the arguments before it)."""
        out: dict[str, Any] = {}
        for spec in self.schema:
            if spec.name in given:
                value = given[spec.name]
                out[spec.name] = float(value) if spec.type is float else value
            elif callable(spec.default):
                value = spec.default(out)  # None: absent, as a plain None default
                if value is not None:
                    out[spec.name] = value
            elif spec.default is not None and spec.default is not REQUIRED:
                out[spec.name] = spec.default
        return out

    # --- shapes -------------------------------------------------------------------------------
    @abstractmethod
    def in_width(self, args: Args) -> int:
        """Width of each token this kind reads from an upstream module."""

    @abstractmethod
    def out_width(self, args: Args) -> int:
        """Width of each token this kind emits."""

    def out_tokens(self, args: Args, in_tokens: int) -> int:
        """Tokens per sample out, given tokens per sample in; ``out_tokens`` overrides."""
        return int(args.get("out_tokens") or in_tokens)

    def layer_tokens(self, args: Args, in_tokens: int) -> int:
        """Tokens per sample every layer but the last works at, given the tokens the module
        reads: ``in_tokens`` unless the input stage adds some (a CLS token) or merges them (a
        strided stem). A kind that changes them reads exactly one raw modality (checked)."""
        return in_tokens

    def reads_modality(self, args: Args, modality: ModalityInfo) -> str | None:
        """None if this kind has an input stage for raw ``modality`` data, else why not."""
        return None

    # --- costs (per sample, per layer) --------------------------------------------------------
    @abstractmethod
    def forward_flops(self, args: Args, in_tokens: int) -> float:
        """Forward FLOPs of one layer for one sample of ``in_tokens`` tokens (2 per MAC)."""

    @abstractmethod
    def layer_params(self, args: Args) -> int:
        """Parameters of one layer; must equal the count of ``build_layer(args)``."""

    def input_stage_params(self, args: Args, modality: ModalityInfo) -> int:
        """Parameters of the stage that turns raw ``modality`` data into tokens."""
        return 0

    def head_params(self, args: Args) -> int:
        """Parameters of the output head (an LM head), 0 if the kind has none."""
        return 0

    def input_stage_flops(self, args: Args, modality: ModalityInfo) -> float | None:
        """Forward FLOPs per sample of the input stage for ``modality``; None leaves them to
        the cost model's estimate from the stage's parameters."""
        return None

    def tail_params(self, args: Args) -> int:
        """Parameters the module's last layer holds beyond ``layer_params`` (a final norm, a
        pooling head: ``kinds/tower.py``); they are part of that layer."""
        return 0

    def tail_flops(self, args: Args, in_tokens: int) -> float:
        """Forward FLOPs per sample of what the last layer runs beyond its block."""
        return 0.0

    def tail_activations(self, args: Args, in_tokens: int) -> float:
        """Elements per sample the last layer saves for backward beyond its block."""
        return 0.0

    def tied_embeddings(self, args: Args) -> bool:
        """Whether the head multiplies by the token embedding of the module's input stage for
        token ids instead of a matrix of its own (``head_params`` then leaves the matrix out,
        and the module must read exactly one vocab modality, whose stage holds it)."""
        return False

    @abstractmethod
    def activation_elements(self, args: Args, in_tokens: int) -> float:
        """Elements one layer keeps for backward, for one sample (memory = this x dtype bytes)."""

    # --- PyTorch --------------------------------------------------------------------------------
    @abstractmethod
    def build_layer(self, args: Args) -> nn.Module:
        """One layer: (batch, in_tokens, in_width) -> (batch, out_tokens, out_width)."""

    def build_input_stage(self, args: Args, modality: ModalityInfo) -> nn.Module:
        """Raw modality data (token ids, or features per token) -> (batch, tokens, in_width)."""
        raise TypeError(f"{self.name} has no input stage for {modality.name}")

    def build_head(self, args: Args) -> nn.Module | None:
        """The output head (hidden -> vocab logits) where the kind has one. A tied head gets
        the input stage it shares the embedding with through its ``tie_to(stage)``."""
        return None


_REGISTRY: dict[str, Kind] = {}


def register_kind(kind: Kind | type[Kind]) -> Kind:
    """Add a kind (an instance or a class) so specs can use it; usable as a class decorator."""
    instance = kind() if isinstance(kind, type) else kind
    _REGISTRY[instance.name] = instance
    return kind  # type: ignore[return-value]


def get_kind(name: str) -> Kind:
    """The kind called ``name``; raises KeyError if none is registered."""
    _load_builtins()
    return _REGISTRY[name]


def kind_names() -> tuple[str, ...]:
    _load_builtins()
    return tuple(sorted(_REGISTRY))


def _load_builtins() -> None:
    # Importing the module registers the built-in kinds; deferred so that base stays importable
    # from builtins without a cycle.
    from spindle_dsl.kinds import builtin  # noqa: F401
