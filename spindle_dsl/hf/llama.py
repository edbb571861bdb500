"""Decoder-only language models: ``llama`` (Llama 2 and 3, Llama 3.1's rope scaling),
``mistral`` and ``qwen2``, as a causal ``transformer`` with SwiGLU, RMSNorm and rotary
positions.

Config fields -> arguments (``TABLE``): ``num_hidden_layers`` layers, ``hidden_size`` hidden,
``num_attention_heads`` heads, ``num_key_value_heads`` kv_heads (default: heads),
``head_dim`` head_dim (default: hidden / heads), ``intermediate_size`` ffn, ``vocab_size``
vocab, ``rms_norm_eps`` norm_eps, ``hidden_act = "silu"`` act = "swiglu",
``tie_word_embeddings`` tie_embeddings, ``rope_theta`` rope_theta and ``rope_scaling``
(``rope_type = "llama3"`` with factor, low/high_freq_factor and
original_max_position_embeddings; older and newer configs nest these as ``rope_scaling`` or
``rope_parameters``). Llama's ``attention_bias`` sets q/k/v and o biases together and
``mlp_bias`` the feed-forward's; Qwen2 has q/k/v biases and no others; Mistral none. A
sliding window (Mistral's ``sliding_window``, Qwen2's with ``use_sliding_window``) is
honoured only when every sequence fits in it (the checker says otherwise).

Tensors (``model.`` prefix in a ``*ForCausalLM`` file, none in a bare model's):
``embed_tokens`` -> the text input stage's ``embed``; ``layers.{i}``'s ``input_layernorm``,
``self_attn.{q,k,v}_proj`` (concatenated into ``qkv``), ``self_attn.o_proj``,
``post_attention_layernorm``, ``mlp.{gate,up}_proj`` (concatenated, gate first, into
``ffn.fc1``) and ``mlp.down_proj``; ``norm`` -> the head's ``ln``; ``lm_head`` (no prefix) ->
the head's ``out`` unless tied. Both use the rotate-half rotary layout and consecutive query
heads per K/V head, so no tensor is permuted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from spindle_dsl.hf.family import BlockNames, Family, Limits, linear_rules, norm_rules
from spindle_dsl.hf.mapping import Config, ConfigTable, Field, Fixed, HfError, Stage, TensorRule
from spindle_dsl.kinds.common import BlockShape

_NUM = (int, float)
_ROPE_FIELDS = (
    ("factor", "rope_factor"),
    ("low_freq_factor", "rope_low_freq_factor"),
    ("high_freq_factor", "rope_high_freq_factor"),
    ("original_max_position_embeddings", "rope_original_max"),
)
_COMMON = (
    Field("num_hidden_layers", "layers", int),
    Field("hidden_size", "hidden", int),
    Field("num_attention_heads", "heads", int),
    Field("num_key_value_heads", "kv_heads", int),
    Field("head_dim", "head_dim", int),
    Field("intermediate_size", "ffn", int),
    Field("vocab_size", "vocab", int),
    Field("rms_norm_eps", "norm_eps", _NUM),
    Field("hidden_act", "act", choices={"silu": "swiglu"}, default="silu"),
    Field("tie_word_embeddings", "tie_embeddings", bool, default=False),
    Field("rope_theta", "rope_theta", _NUM),
    Field(
        "rope_scaling.rope_type", "rope_scaling", choices={"default": "none", "llama3": "llama3"}
    ),
    Field("rope_scaling.factor", "rope_factor", _NUM, default=None),
    Field("rope_scaling.low_freq_factor", "rope_low_freq_factor", _NUM, default=None),
    Field("rope_scaling.high_freq_factor", "rope_high_freq_factor", _NUM, default=None),
    Field("rope_scaling.original_max_position_embeddings", "rope_original_max", int, default=None),
    Fixed("causal", True),
    Fixed("norm", "rmsnorm"),
    Fixed("pos", "rotary"),
    Fixed("bias", False),
)

BLOCK = BlockNames(
    ln1="input_layernorm",
    q="self_attn.q_proj",
    k="self_attn.k_proj",
    v="self_attn.v_proj",
    o="self_attn.o_proj",
    ln2="post_attention_layernorm",
    up=("mlp.gate_proj", "mlp.up_proj"),
    down="mlp.down_proj",
)


def _rope(cfg: Config) -> tuple[Any, dict]:
    """(rope_theta, the scaling dict) from either nesting (``rope_theta`` beside
    ``rope_scaling``, or both in ``rope_parameters``)."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict):
        theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        return theta, params
    scaling = cfg.get("rope_scaling")
    return cfg.get("rope_theta", 10000.0), scaling if isinstance(scaling, dict) else {}


class Llama(Family):
    name = "llama"
    model_type = "llama"
    architecture = "LlamaForCausalLM"
    kind = "transformer"
    table: ClassVar[ConfigTable] = ConfigTable(
        (
            *_COMMON,
            Field("attention_bias", ("qkv_bias", "out_bias"), bool, default=False),
            Field("mlp_bias", "mlp_bias", bool, default=False),
        )
    )
    block = BLOCK
    layers_prefix = "layers.{i}."
    prefixes = ("model.", "")
    export_prefix = "model."
    config_defaults: ClassVar[Mapping[str, Any]] = {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
    }

    def flat(self, cfg: Config) -> dict[str, Any]:
        out = dict(cfg)
        heads = cfg.get("num_attention_heads")
        if cfg.get("num_key_value_heads") is None:
            out["num_key_value_heads"] = heads
        if cfg.get("head_dim") is None and isinstance(heads, int) and heads > 0:
            hidden = cfg.get("hidden_size")
            out["head_dim"] = hidden // heads if isinstance(hidden, int) else None
        theta, scaling = _rope(cfg)
        out["rope_theta"] = theta
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        out["rope_scaling.rope_type"] = rope_type
        if rope_type == "llama3":
            for key, _ in _ROPE_FIELDS:
                if key not in scaling:
                    raise HfError(f"rope_scaling has no {key}", f"rope_scaling.{key}")
                out[f"rope_scaling.{key}"] = scaling[key]
        return out

    def unflat(self, flat: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in flat.items() if not k.startswith("rope_scaling.")}
        if flat.get("rope_scaling.rope_type") == "llama3":
            out["rope_scaling"] = {"rope_type": "llama3"} | {
                key: flat[f"rope_scaling.{key}"] for key, _ in _ROPE_FIELDS
            }
        else:
            out["rope_scaling"] = None
        return out

    def window(self, cfg: Config) -> int | None:
        """The sliding attention window this config asks for, if any."""
        return None

    def limits(self, cfg: Config) -> Limits:
        window = self.window(cfg)
        text = None if window is None else (int(window), f"sliding_window = {window}")
        return Limits(vocab=cfg.get("vocab_size"), window=text)

    def extra_rules(
        self, args: Mapping[str, Any], shape: BlockShape, stage: Stage | None, prefix: str
    ) -> list[TensorRule]:
        h, vocab = shape.hidden, int(args["vocab"])
        out = norm_rules("head.ln", f"{prefix}norm", h, bias=False)
        if not args.get("tie_embeddings"):
            out += linear_rules("head.out", "lm_head", vocab, h, bias=False)
        if stage is not None:
            out.append(
                TensorRule(
                    f"{stage.role}.embed.weight", (f"{prefix}embed_tokens.weight",), ((vocab, h),)
                )
            )
        return out


class Mistral(Llama):
    name = "mistral"
    model_type = "mistral"
    architecture = "MistralForCausalLM"
    table: ClassVar[ConfigTable] = ConfigTable(
        (*_COMMON, Fixed("qkv_bias", False), Fixed("out_bias", False), Fixed("mlp_bias", False))
    )
    config_defaults: ClassVar[Mapping[str, Any]] = {
        **Llama.config_defaults,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
        "sliding_window": 4096,
    }

    def window(self, cfg: Config) -> int | None:
        window = cfg.get("sliding_window")
        return window if isinstance(window, int) and not isinstance(window, bool) else None

    def unflat(self, flat: dict[str, Any]) -> dict[str, Any]:
        return super().unflat(flat) | {"sliding_window": None}


class Qwen2(Llama):
    name = "qwen2"
    model_type = "qwen2"
    architecture = "Qwen2ForCausalLM"
    table: ClassVar[ConfigTable] = ConfigTable(
        (*_COMMON, Fixed("qkv_bias", True), Fixed("out_bias", False), Fixed("mlp_bias", False))
    )
    config_defaults: ClassVar[Mapping[str, Any]] = {
        **Llama.config_defaults,
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "max_position_embeddings": 32768,
    }

    def window(self, cfg: Config) -> int | None:
        if not cfg.get("use_sliding_window"):
            return None
        return Mistral.window(self, cfg)

    def unflat(self, flat: dict[str, Any]) -> dict[str, Any]:
        return super().unflat(flat) | {"use_sliding_window": False}
