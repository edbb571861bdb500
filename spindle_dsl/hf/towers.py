"""Vision towers and text and audio encoders: ``vit``, ``clip_vision_model``,
``clip_text_model``, ``siglip_vision_model`` and ``whisper``'s encoder (the towers of a
``clip`` or ``siglip`` config are these, read from its ``vision_config`` / ``text_config``).

What each maps (config -> arguments; tensors -> ours), beside the block's own tensors:

- ``vit`` -> ``vit(cls, final_norm, pool = "dense")``: ``layer_norm_eps`` norm_eps (1e-12),
  ``qkv_bias``; ``embeddings.cls_token`` -> the stage's ``cls``, ``position_embeddings`` ->
  ``pos`` (the CLS row first), ``patch_embeddings.projection`` (a convolution kernel) ->
  ``proj`` (its matrix), ``layernorm`` -> the tail's ``norm``, ``pooler.dense`` -> the tail's
  ``pool``.
- ``clip_vision_model`` -> ``vit(cls, embed_norm, patch_bias = false, pool = "norm")`` with
  quick GELU: ``class_embedding`` -> ``cls``, ``patch_embedding`` -> ``proj``,
  ``position_embedding`` -> ``pos``, ``pre_layrnorm`` -> the stage's ``norm``,
  ``post_layernorm`` -> the tail's ``pool`` (CLIP normalises only the pooled CLS token).
- ``clip_text_model`` -> a causal ``transformer`` with learned ``positions =
  max_position_embeddings`` and ``final_norm`` (no LM head): ``token_embedding`` ->
  ``embed``, ``position_embedding`` -> ``pos``, ``final_layer_norm`` -> the tail's ``norm``.
- ``siglip_vision_model`` -> ``vit(final_norm, pool = "map")`` with tanh GELU and eps 1e-6:
  ``patch_embedding`` -> ``proj``, ``position_embedding`` -> ``pos``, ``post_layernorm`` -> the
  tail's ``norm``, ``head.probe``, ``head.attention`` (torch's fused ``in_proj``),
  ``head.layernorm`` and ``head.mlp`` -> the tail's attention pool.
- ``whisper`` (the encoder) -> ``transformer(stem = "conv", pos = "sinusoidal", k_bias =
  false, final_norm)``: ``conv1``/``conv2`` -> the stem, ``embed_positions`` -> the fixed
  ``pos`` (``positions = max_source_positions``), ``layer_norm`` -> the tail's ``norm``.

Their blocks are a norm, q/k/v/o projections and a norm before the feed-forward's ``fc1`` and
``fc2``, each family naming them its own way (``BlockNames``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from spindle_dsl.hf.family import BlockNames, Family, Limits, linear_rules, norm_rules
from spindle_dsl.hf.mapping import (
    Config,
    ConfigTable,
    Field,
    Fixed,
    HfError,
    NotExpressible,
    Stage,
    TensorRule,
)
from spindle_dsl.kinds.common import BlockShape

_NUM = (int, float)
ACTS = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "quick_gelu": "quick_gelu",
}


def _shape(act: str) -> tuple[Field | Fixed, ...]:
    """The fields every tower names alike; ``act``: the config class's default activation."""
    return (
        Field("num_hidden_layers", "layers", int),
        Field("hidden_size", "hidden", int),
        Field("num_attention_heads", "heads", int),
        Field("intermediate_size", "ffn", int),
        Field("hidden_act", "act", choices=ACTS, default=act),
        Fixed("norm", "layernorm"),
        Fixed("bias", True),
    )


def _vision(act: str) -> tuple[Field | Fixed, ...]:
    return (*_shape(act), Field("patch_size", "patch", int))


CLIP_BLOCK = BlockNames(
    ln1="layer_norm1",
    q="self_attn.q_proj",
    k="self_attn.k_proj",
    v="self_attn.v_proj",
    o="self_attn.out_proj",
    ln2="layer_norm2",
    up=("mlp.fc1",),
    down="mlp.fc2",
)


def _image_limits(cfg: Config) -> Limits:
    channels = cfg.get("num_channels", 3)
    if channels != 3:
        raise HfError(f"num_channels = {channels}: images are read as RGB", "num_channels")
    return Limits(image_size=cfg.get("image_size"), patch=cfg.get("patch_size"))


def _patch_rules(stage: Stage, theirs: str, h: int, patch: int, bias: bool) -> list[TensorRule]:
    """A convolution kernel (h, 3, p, p) with stride p is a linear layer of its matrix."""
    out = [TensorRule(f"{stage.role}.proj.weight", (f"{theirs}.weight",), ((h, 3, patch, patch),))]
    if bias:
        out.append(TensorRule(f"{stage.role}.proj.bias", (f"{theirs}.bias",), ((h,),)))
    return out


def _image_config(args: Mapping[str, Any], stage: Stage | None) -> dict[str, Any]:
    """image_size and num_channels of a square image of ``stage.tokens`` patches."""
    if stage is None:
        return {}
    side = math.isqrt(stage.tokens)
    if side * side != stage.tokens:
        raise NotExpressible(f"its {stage.tokens} patches are not a square image")
    return {"image_size": side * int(args["patch"]), "num_channels": 3}


class _Vision(Family):
    """What the vision towers share: images from config.json, and back."""

    def limits(self, cfg: Config) -> Limits:
        return _image_limits(cfg)

    def config(self, args: Mapping[str, Any], stage: Stage | None) -> dict[str, Any]:
        return super().config(args, stage) | _image_config(args, stage)


def _tail(args: Mapping[str, Any]) -> str:
    return f"layer.{int(args['layers']) - 1}.tail"


class ViT(_Vision):
    name = "vit"
    model_type = "vit"
    architecture = "ViTModel"
    kind = "vit"
    table: ClassVar[ConfigTable] = ConfigTable(
        (
            *_vision("gelu"),
            Field("layer_norm_eps", "norm_eps", _NUM, default=1e-12),
            Field("qkv_bias", "qkv_bias", bool, default=True),
            Fixed("cls", True),
            Fixed("final_norm", True),
            Fixed("embed_norm", False),
            Fixed("patch_bias", True),
        )
    )
    block = BlockNames(
        ln1="layernorm_before",
        q="attention.attention.query",
        k="attention.attention.key",
        v="attention.attention.value",
        o="attention.output.dense",
        ln2="layernorm_after",
        up=("intermediate.dense",),
        down="output.dense",
    )
    layers_prefix = "encoder.layer.{i}."
    prefixes = ("", "vit.")
    config_defaults: ClassVar[Mapping[str, Any]] = {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "image_size": 224,
        "patch_size": 16,
    }
    defaults: ClassVar[Mapping[str, Any]] = {"pool": "dense", "output": "tokens"}

    def flat(self, cfg: Config) -> dict[str, Any]:
        act = cfg.get("pooler_act", "tanh")
        if act != "tanh":
            raise HfError(
                f'pooler_act = "{act}" is not supported (supported: "tanh")', "pooler_act"
            )
        size = cfg.get("pooler_output_size", cfg.get("hidden_size"))
        if size != cfg.get("hidden_size"):
            raise HfError(
                f"pooler_output_size = {size} differs from hidden_size", "pooler_output_size"
            )
        return dict(cfg)

    def extra_rules(
        self, args: Mapping[str, Any], shape: BlockShape, stage: Stage | None, prefix: str
    ) -> list[TensorRule]:
        h, tail = shape.hidden, _tail(args)
        out = norm_rules(f"{tail}.norm", f"{prefix}layernorm", h, bias=True)
        if args.get("pool") == "dense":
            out += linear_rules(f"{tail}.pool", f"{prefix}pooler.dense", h, h, bias=True)
        if stage is not None:
            e = f"{prefix}embeddings."
            out += [
                TensorRule(f"{stage.role}.cls", (e + "cls_token",), ((1, 1, h),)),
                TensorRule(
                    f"{stage.role}.pos", (e + "position_embeddings",), ((1, stage.tokens + 1, h),)
                ),
                *_patch_rules(
                    stage, e + "patch_embeddings.projection", h, int(args["patch"]), True
                ),
            ]
        return out


class ClipVision(_Vision):
    name = "clip_vision_model"
    model_type = "clip_vision_model"
    architecture = "CLIPVisionModel"
    kind = "vit"
    table: ClassVar[ConfigTable] = ConfigTable(
        (
            *_vision("quick_gelu"),
            Field("layer_norm_eps", "norm_eps", _NUM, default=1e-5),
            Fixed("cls", True),
            Fixed("embed_norm", True),
            Fixed("final_norm", False),
            Fixed("patch_bias", False),
            Fixed("pool", "norm"),
        )
    )
    block = CLIP_BLOCK
    layers_prefix = "encoder.layers.{i}."
    prefixes = ("vision_model.", "")
    config_defaults: ClassVar[Mapping[str, Any]] = {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "image_size": 224,
        "patch_size": 32,
    }
    export_prefix = "vision_model."
    defaults: ClassVar[Mapping[str, Any]] = {"output": "tokens"}

    def extra_rules(
        self, args: Mapping[str, Any], shape: BlockShape, stage: Stage | None, prefix: str
    ) -> list[TensorRule]:
        h = shape.hidden
        out = norm_rules(f"{_tail(args)}.pool", f"{prefix}post_layernorm", h, bias=True)
        if stage is not None:
            e = f"{prefix}embeddings."
            out += [
                TensorRule(f"{stage.role}.cls", (e + "class_embedding",), ((h,),)),
                TensorRule(
                    f"{stage.role}.pos",
                    (e + "position_embedding.weight",),
                    ((stage.tokens + 1, h),),
                ),
                *_patch_rules(stage, e + "patch_embedding", h, int(args["patch"]), False),
                *norm_rules(f"{stage.role}.norm", f"{prefix}pre_layrnorm", h, bias=True),
            ]
        return out


class ClipText(Family):
    name = "clip_text_model"
    model_type = "clip_text_model"
    architecture = "CLIPTextModel"
    kind = "transformer"
    table: ClassVar[ConfigTable] = ConfigTable(
        (
            *_shape("quick_gelu"),
            Field("layer_norm_eps", "norm_eps", _NUM, default=1e-5),
            Field("max_position_embeddings", "positions", int),
            Fixed("causal", True),
            Fixed("pos", "learned"),
            Fixed("final_norm", True),
        )
    )
    block = CLIP_BLOCK
    layers_prefix = "encoder.layers.{i}."
    prefixes = ("text_model.", "")
    config_defaults: ClassVar[Mapping[str, Any]] = {
        "vocab_size": 49408,
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "max_position_embeddings": 77,
    }
    export_prefix = "text_model."

    def limits(self, cfg: Config) -> Limits:
        return Limits(vocab=cfg.get("vocab_size"), positions=cfg.get("max_position_embeddings"))

    def extra_rules(
        self, args: Mapping[str, Any], shape: BlockShape, stage: Stage | None, prefix: str
    ) -> list[TensorRule]:
        h = shape.hidden
        out = norm_rules(f"{_tail(args)}.norm", f"{prefix}final_layer_norm", h, bias=True)
        if stage is not None and stage.vocab is not None:
            e = f"{prefix}embeddings."
            rows = int(args["positions"])
            out += [
                TensorRule(
                    f"{stage.role}.embed.weight",
                    (e + "token_embedding.weight",),
                    ((stage.vocab, h),),
                ),
                TensorRule(f"{stage.role}.pos", (e + "position_embedding.weight",), ((rows, h),)),
            ]
        return out

    def config(self, args: Mapping[str, Any], stage: Stage | None) -> dict[str, Any]:
        out = super().config(args, stage)
        if stage is not None and stage.vocab is not None:
            out["vocab_size"] = stage.vocab
        return out


class SiglipVision(_Vision):
    name = "siglip_vision_model"
    model_type = "siglip_vision_model"
    architecture = "SiglipVisionModel"
    kind = "vit"
    table: ClassVar[ConfigTable] = ConfigTable(
        (
            *_vision("gelu_pytorch_tanh"),
            Field("layer_norm_eps", "norm_eps", _NUM, default=1e-6),
            Field("vision_use_head", "pool", choices={True: "map", False: "none"}, default=True),
            Fixed("cls", False),
            Fixed("embed_norm", False),
            Fixed("final_norm", True),
            Fixed("patch_bias", True),
        )
    )
    block = CLIP_BLOCK
    layers_prefix = "encoder.layers.{i}."
    prefixes = ("vision_model.", "")
    config_defaults: ClassVar[Mapping[str, Any]] = {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "image_size": 224,
        "patch_size": 16,
    }
    export_prefix = "vision_model."
    defaults: ClassVar[Mapping[str, Any]] = {"output": "tokens"}

    def extra_rules(
        self, args: Mapping[str, Any], shape: BlockShape, stage: Stage | None, prefix: str
    ) -> list[TensorRule]:
        h, f, tail = shape.hidden, shape.ffn, _tail(args)
        out = norm_rules(f"{tail}.norm", f"{prefix}post_layernorm", h, bias=True)
        if args.get("pool") == "map":
            head, pool = f"{prefix}head.", f"{tail}.pool"
            out += [
                TensorRule(f"{pool}.probe", (head + "probe",), ((1, 1, h),)),
                TensorRule(
                    f"{pool}.qkv.weight", (head + "attention.in_proj_weight",), ((3 * h, h),)
                ),
                TensorRule(f"{pool}.qkv.bias", (head + "attention.in_proj_bias",), ((3 * h,),)),
                *linear_rules(f"{pool}.proj", head + "attention.out_proj", h, h, bias=True),
                *norm_rules(f"{pool}.norm", head + "layernorm", h, bias=True),
                *linear_rules(f"{pool}.ffn.fc1", head + "mlp.fc1", f, h, bias=True),
                *linear_rules(f"{pool}.ffn.fc2", head + "mlp.fc2", h, f, bias=True),
            ]
        if stage is not None:
            e = f"{prefix}embeddings."
            out += [
                TensorRule(
                    f"{stage.role}.pos", (e + "position_embedding.weight",), ((stage.tokens, h),)
                ),
                *_patch_rules(stage, e + "patch_embedding", h, int(args["patch"]), True),
            ]
        return out


class WhisperEncoder(Family):
    name = "whisper"
    model_type = "whisper"
    architecture = "WhisperModel"
    kind = "transformer"
    table: ClassVar[ConfigTable] = ConfigTable(
        (
            Field("encoder_layers", "layers", int),
            Field("d_model", "hidden", int),
            Field("encoder_attention_heads", "heads", int),
            Field("encoder_ffn_dim", "ffn", int),
            Field("activation_function", "act", choices=ACTS, default="gelu"),
            Field("max_source_positions", "positions", int),
            Fixed("norm", "layernorm"),
            Fixed("norm_eps", 1e-5),
            Fixed("bias", True),
            Fixed("k_bias", False),
            Fixed("stem", "conv"),
            Fixed("pos", "sinusoidal"),
            Fixed("final_norm", True),
            Fixed("causal", False),
        )
    )
    block = BlockNames(
        ln1="self_attn_layer_norm",
        q="self_attn.q_proj",
        k="self_attn.k_proj",
        v="self_attn.v_proj",
        o="self_attn.out_proj",
        ln2="final_layer_norm",
        up=("fc1",),
        down="fc2",
    )
    layers_prefix = "layers.{i}."
    prefixes = ("encoder.", "model.encoder.")
    config_defaults: ClassVar[Mapping[str, Any]] = {
        "num_mel_bins": 80,
        "encoder_layers": 4,
        "encoder_attention_heads": 6,
        "encoder_ffn_dim": 1536,
        "d_model": 384,
        "max_source_positions": 1500,
    }
    export_prefix = "encoder."
    carries = True

    def limits(self, cfg: Config) -> Limits:
        positions = cfg.get("max_source_positions")
        frames = 2 * positions if isinstance(positions, int) else None
        return Limits(features=cfg.get("num_mel_bins"), frames=frames)

    def extra_rules(
        self, args: Mapping[str, Any], shape: BlockShape, stage: Stage | None, prefix: str
    ) -> list[TensorRule]:
        h = shape.hidden
        out = norm_rules(f"{_tail(args)}.norm", f"{prefix}layer_norm", h, bias=True)
        if stage is not None and stage.features is not None:
            role, mels, rows = stage.role, stage.features, int(args["positions"])
            out += [
                TensorRule(f"{role}.conv1.weight", (f"{prefix}conv1.weight",), ((h, mels, 3),)),
                TensorRule(f"{role}.conv1.bias", (f"{prefix}conv1.bias",), ((h,),)),
                TensorRule(f"{role}.conv2.weight", (f"{prefix}conv2.weight",), ((h, h, 3),)),
                TensorRule(f"{role}.conv2.bias", (f"{prefix}conv2.bias",), ((h,),)),
                TensorRule(f"{role}.pos", (f"{prefix}embed_positions.weight",), ((rows, h),)),
            ]
        return out

    def config(self, args: Mapping[str, Any], stage: Stage | None) -> dict[str, Any]:
        out = super().config(args, stage)
        if stage is not None and stage.features is not None:
            out["num_mel_bins"] = stage.features
        return out
