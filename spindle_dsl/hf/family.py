"""What every supported architecture says about itself, and the block layout they share.

A ``Family`` is one Hugging Face architecture (one ``model_type``, or one tower of a model
that has two): its config table (``mapping.ConfigTable``) over a flat view of config.json
(``flat``/``unflat``: the only place where a config's nesting, such as ``rope_scaling``, is
unpacked and packed again), the modality figures the config fixes (``Limits``), and its tensor
rules. Blocks are laid out alike in every family (a norm, q/k/v, an output projection, a norm,
one or two up projections, a down projection), so a family names its block's tensors once
(``BlockNames``) and ``block_rules`` expands them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from spindle_dsl.hf.mapping import Config, ConfigTable, HfError, Rules, Stage, TensorRule, show
from spindle_dsl.kinds import get_kind
from spindle_dsl.kinds.common import BlockShape


@dataclass(frozen=True)
class Limits:
    """What the data a model reads must agree with, from its config: the vocabulary, the
    image side and patch, the features per frame and the frames, the rows of a learned text
    position table, and a sliding attention window (with the config text that sets it)."""

    vocab: int | None = None
    image_size: int | None = None
    patch: int | None = None
    features: int | None = None
    frames: int | None = None
    positions: int | None = None
    window: tuple[int, str] | None = None


@dataclass(frozen=True)
class BlockNames:
    """A family's names for one block's tensors, relative to the block's prefix. ``up`` is
    one name, or two for a gated feed-forward net (gate first, as our fused matrix)."""

    ln1: str
    q: str
    k: str
    v: str
    o: str
    ln2: str
    up: tuple[str, ...]
    down: str


def block_rules(prefix: str, role: str, shape: BlockShape, names: BlockNames) -> list[TensorRule]:
    """The rules of one block: our ``ROLE.*`` parameters from their ``PREFIX*`` tensors."""
    h, q, kv = shape.hidden, shape.q_width, shape.kv_width
    norm_bias = shape.norm == "layernorm"
    out: list[TensorRule] = []

    def rule(ours: str, theirs: list[str], shapes: list[tuple[int, ...]]) -> None:
        out.append(TensorRule(f"{role}.{ours}", tuple(prefix + t for t in theirs), tuple(shapes)))

    for ours, theirs in (("ln1", names.ln1), ("ln2", names.ln2)):
        rule(f"{ours}.weight", [f"{theirs}.weight"], [(h,)])
        if norm_bias:
            rule(f"{ours}.bias", [f"{theirs}.bias"], [(h,)])
    qkv = [names.q, names.k, names.v]
    rule("qkv.weight", [f"{n}.weight" for n in qkv], [(q, h), (kv, h), (kv, h)])
    if shape.qkv_bias and shape.has_k_bias:
        rule("qkv.bias", [f"{n}.bias" for n in qkv], [(q,), (kv,), (kv,)])
    elif shape.qkv_bias:  # no bias on k: q's and v's are held apart
        rule("q_bias", [f"{names.q}.bias"], [(q,)])
        rule("v_bias", [f"{names.v}.bias"], [(kv,)])
    rule("proj.weight", [f"{names.o}.weight"], [(h, q)])
    if shape.has_out_bias:
        rule("proj.bias", [f"{names.o}.bias"], [(h,)])
    f = shape.ffn
    rule("ffn.fc1.weight", [f"{n}.weight" for n in names.up], [(f, h)] * len(names.up))
    if shape.bias:
        rule("ffn.fc1.bias", [f"{n}.bias" for n in names.up], [(f,)] * len(names.up))
    rule("ffn.fc2.weight", [f"{names.down}.weight"], [(h, f)])
    if shape.bias:
        rule("ffn.fc2.bias", [f"{names.down}.bias"], [(h,)])
    return out


def norm_rules(ours: str, theirs: str, width: int, bias: bool) -> list[TensorRule]:
    """A norm's weight (and bias)."""
    out = [TensorRule(f"{ours}.weight", (f"{theirs}.weight",), ((width,),))]
    if bias:
        out.append(TensorRule(f"{ours}.bias", (f"{theirs}.bias",), ((width,),)))
    return out


def linear_rules(ours: str, theirs: str, n_out: int, n_in: int, bias: bool) -> list[TensorRule]:
    out = [TensorRule(f"{ours}.weight", (f"{theirs}.weight",), ((n_out, n_in),))]
    if bias:
        out.append(TensorRule(f"{ours}.bias", (f"{theirs}.bias",), ((n_out,),)))
    return out


class Family:
    """One architecture (see the module docstring); subclasses fill in the class fields and
    override ``flat``, ``unflat``, ``limits`` and ``extra_rules``."""

    name: ClassVar[str]
    model_type: ClassVar[str]  # the model_type it exports as
    architecture: ClassVar[str]  # the transformers class it exports as ("LlamaForCausalLM")
    kind: ClassVar[str]
    table: ClassVar[ConfigTable]
    block: ClassVar[BlockNames]
    layers_prefix: ClassVar[str]  # where block i's tensors live, with {i}
    prefixes: ClassVar[tuple[str, ...]] = ("",)  # where its keys may sit in a file
    export_prefix: ClassVar[str] = ""
    # the transformers model holds more than the module (Whisper's decoder): an export from
    # a folder with weights keeps that folder's layout and copies the rest unchanged
    carries: ClassVar[bool] = False
    # structural arguments the config does not hold, which a spec may override
    defaults: ClassVar[Mapping[str, Any]] = {}
    # the transformers config class's defaults, for the fields a config.json leaves out
    config_defaults: ClassVar[Mapping[str, Any]] = {}

    def flat(self, cfg: Config) -> dict[str, Any]:
        """config.json as the table reads it (nesting unpacked, derived defaults filled)."""
        return dict(cfg)

    def unflat(self, flat: dict[str, Any]) -> dict[str, Any]:
        """The table's output packed as config.json holds it (``flat``'s inverse)."""
        return flat

    def limits(self, cfg: Config) -> Limits:
        return Limits()

    def args(self, cfg: Config) -> dict[str, Any]:
        """The kind arguments of ``cfg`` (a config of this family), structural defaults
        included; raises ``HfError`` naming the field at fault."""
        args = {**self.defaults, **self.table.to_args(self.flat(cfg))}
        hidden, heads = int(args["hidden"]), int(args["heads"])
        if args.get("head_dim") in (None, hidden // heads) and hidden % heads == 0:
            args.pop("head_dim", None)
        return args

    def config(self, args: Mapping[str, Any], stage: Stage | None) -> dict[str, Any]:
        """The config fields of a module with these resolved arguments (``NotExpressible``
        when the architecture cannot hold it)."""
        full = dict(args)
        full.setdefault("head_dim", int(args["hidden"]) // int(args["heads"]))
        return self.unflat(self.table.to_config(full))

    def shape(self, args: Mapping[str, Any]) -> BlockShape:
        return get_kind(self.kind).block(dict(args))  # type: ignore[attr-defined]

    def rules(self, args: Mapping[str, Any], stage: Stage | None, prefix: str) -> Rules:
        """Every tensor rule of a module with these arguments whose keys sit under ``prefix``
        (``stage``: its raw input stage, if any)."""
        shape = self.shape(args)
        out: list[TensorRule] = []
        for i in range(int(args["layers"])):
            out += block_rules(
                prefix + self.layers_prefix.format(i=i), f"layer.{i}", shape, self.block
            )
        out += self.extra_rules(args, shape, stage, prefix)
        return Rules(tuple(out), prefix)

    def extra_rules(
        self, args: Mapping[str, Any], shape: BlockShape, stage: Stage | None, prefix: str
    ) -> list[TensorRule]:
        """The rules outside the blocks: input stage, tail, head."""
        return []

    def anchor(self, args: Mapping[str, Any]) -> str:
        """A key every file of this family holds (under its prefix): the first block's q."""
        return self.layers_prefix.format(i=0) + self.block.q + ".weight"


def require(cfg: Config, key: str, kind: type | tuple[type, ...] = int) -> Any:
    """``cfg[key]``, which must exist with a JSON value of type ``kind``."""
    if key not in cfg:
        raise HfError(f"config.json has no {key}", key)
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise HfError(f"{key} = {show(value)} is not a number", key)
    return value
