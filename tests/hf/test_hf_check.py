"""``hf("DIR")`` in the checker: the kind and arguments from config.json, what a spec may add
or must not contradict, the data held to what the config fixes, clear errors at the string or
the modality for whatever the project cannot honour, and ``spindle fmt`` keeping it as
written. Every folder here holds only a config.json: checking and planning read nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spindle_dsl.cli import main
from spindle_dsl.errors import SpecError
from spindle_dsl.language import compile_text, format_spec, parse

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "rms_norm_eps": 1e-5,
}
TINY_VIT = {
    "model_type": "vit",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 32,
    "patch_size": 8,
}
TINY_CLIP = {
    "model_type": "clip",
    "vision_config": {**TINY_VIT, "model_type": "clip_vision_model"},
    "text_config": {**TINY_VIT, "model_type": "clip_text_model", "vocab_size": 100},
}
LM_TASK = (
    "modality text { tokens = 16; vocab = 100 }\ntask t { text -> lm; loss = lm; batch = 2 }\n"
)
IMAGE_TASK = "modality image { tokens = 16 }\ntask t { image -> v; loss = mse; batch = 2 }\n"


def folder(tmp: Path, name: str, config: dict) -> str:
    (tmp / name).mkdir()
    (tmp / name / "config.json").write_text(json.dumps(config))
    return name


def compiled(tmp: Path, text: str):
    return compile_text(text, str(tmp / "job.spindle"))


def errors(tmp: Path, text: str) -> str:
    with pytest.raises(SpecError) as exc:
        compiled(tmp, text)
    return str(exc.value)


def test_the_kind_and_arguments_come_from_the_config(tmp_path) -> None:
    folder(tmp_path, "llama", TINY_LLAMA)
    graph = compiled(tmp_path, 'module lm : hf("llama")\n' + LM_TASK).graph
    lm = graph.module("lm")
    assert lm.kind == "transformer" and lm.hf == str(tmp_path / "llama")
    args = dict(lm.args)
    assert (args["hidden"], args["kv_heads"], args["norm_eps"], args["act"]) == (
        32,
        2,
        1e-5,
        "swiglu",
    )
    assert args["pos"] == "rotary" and args["causal"] is True and lm.weights is None


def test_check_prints_the_resolved_kind_and_fmt_keeps_hf_as_written(tmp_path, capsys) -> None:
    folder(tmp_path, "llama", TINY_LLAMA)
    text = 'module   lm :hf( "llama" )\n' + LM_TASK
    spec = tmp_path / "job.spindle"
    spec.write_text(text)
    assert main(["check", str(spec)]) == 0
    out = capsys.readouterr()
    assert f'lm: hf("{tmp_path / "llama"}") = transformer(act = "swiglu"' in out.out
    assert "holds no weights" in out.err  # a config alone: the seeded start, said once
    formatted = format_spec(parse(text))
    assert formatted.startswith('module lm : hf("llama")\n')
    assert parse(formatted) == parse(text)


def test_a_spec_adds_what_the_config_does_not_hold(tmp_path) -> None:
    folder(tmp_path, "vit", TINY_VIT)
    plain = compiled(tmp_path, 'encoder v : hf("vit") <- image\n' + IMAGE_TASK).graph
    chosen = compiled(
        tmp_path, 'encoder v : hf("vit", pool = "none", output = "cls") <- image\n' + IMAGE_TASK
    ).graph
    assert plain.op("t/v").out_tokens == 17 and chosen.op("t/v").out_tokens == 1
    assert plain.module("v").params - chosen.module("v").params == 32 * 32 + 32  # the pooler


def test_an_argument_that_disagrees_with_the_config_is_an_error_at_it(tmp_path) -> None:
    folder(tmp_path, "llama", TINY_LLAMA)
    same = compiled(tmp_path, 'module lm : hf("llama", hidden = 32)\n' + LM_TASK)
    assert dict(same.graph.module("lm").args)["hidden"] == 32
    message = errors(tmp_path, 'module lm : hf("llama", hidden = 64)\n' + LM_TASK)
    assert "1:25: error: 'hidden = 64' disagrees" in message
    assert "hidden_size = 32" in message
    message = errors(tmp_path, 'module lm : hf("llama", norm = "layernorm")\n' + LM_TASK)
    assert "llama fixes norm = 'rmsnorm'" in message


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"model_type": "gpt2"}, 'model_type = "gpt2" is not supported (supported: clip,'),
        ({"hidden_act": "relu"}, 'hidden_act = "relu" is not supported (supported: "silu")'),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            'rope_scaling.rope_type = "yarn" is not supported',
        ),
        ({"hidden_size": "wide"}, 'hidden_size = "wide" must be a int'),
        ({"num_key_value_heads": 3}, "heads = 4 is not divisible by kv_heads = 3"),
        ({"num_attention_heads": 0}, "num_attention_heads = 0 must be at least 1"),
        ({"rope_scaling": {"rope_type": "llama3"}}, "rope_scaling has no factor"),
    ],
)
def test_a_config_the_project_cannot_honour_is_an_error_at_the_string(
    tmp_path, change, says
) -> None:
    folder(tmp_path, "m", {**TINY_LLAMA, **change})
    message = errors(tmp_path, 'module lm : hf("m")\n' + LM_TASK)
    assert "job.spindle:1:16: error:" in message and says in message


def test_a_sliding_window_shorter_than_the_sequence_is_an_error(tmp_path) -> None:
    folder(tmp_path, "mistral", {**TINY_LLAMA, "model_type": "mistral", "sliding_window": 8})
    message = errors(tmp_path, 'module lm : hf("mistral")\n' + LM_TASK)
    assert "1:16: error: sliding_window = 8 in" in message
    assert "shorter than the 16 tokens task 't' feeds module 'lm'" in message
    window = {**TINY_LLAMA, "model_type": "mistral", "sliding_window": 16}
    folder(tmp_path, "fits", window)
    assert compiled(tmp_path, 'module lm : hf("fits")\n' + LM_TASK).graph


def test_data_that_disagrees_with_the_config_is_an_error_at_the_modality(tmp_path) -> None:
    folder(tmp_path, "llama", TINY_LLAMA)
    message = errors(tmp_path, 'module lm : hf("llama")\n' + LM_TASK.replace("= 100", "= 90"))
    assert "2:30: error: modality 'text' has vocab = 90, but" in message
    assert "has vocab_size = 100" in message
    folder(tmp_path, "vit", TINY_VIT)
    message = errors(
        tmp_path, 'encoder v : hf("vit") <- image\n' + IMAGE_TASK.replace("16 }", "25 }")
    )
    assert "2:18: error: modality 'image' has tokens = 25" in message
    assert "image_size = 32 and patch_size = 8: 16 patches" in message


def test_a_two_tower_config_takes_the_tower_its_data_or_the_spec_names(tmp_path) -> None:
    folder(tmp_path, "clip", TINY_CLIP)
    vision = compiled(tmp_path, 'encoder v : hf("clip") <- image\n' + IMAGE_TASK).graph
    assert vision.module("v").kind == "vit"
    text = "modality text { tokens = 16; vocab = 100 }\n"
    text += 'module v : hf("clip", tower = "text")\n'
    text += "task t { text -> v; loss = mse; batch = 2 }\n"
    assert compiled(tmp_path, text).graph.module("v").kind == "transformer"
    unbound = text.replace(', tower = "text"', "")
    assert 'holds towers "vision" or "text"; say which: tower = ...' in errors(tmp_path, unbound)


def test_a_from_folder_must_agree_with_the_declared_arguments(tmp_path) -> None:
    folder(tmp_path, "llama", TINY_LLAMA)
    (tmp_path / "llama" / "model.safetensors").write_bytes(b"")  # present; not read here
    declared = (
        "module lm : transformer(layers = 2, hidden = 32, heads = 4, kv_heads = 2, ffn = 64, "
        'causal = true, vocab = 100, act = "swiglu", norm = "rmsnorm", norm_eps = 1e-5, '
        'pos = "rotary", bias = false) from "llama"\n'
    )
    graph = compiled(tmp_path, declared + LM_TASK).graph
    assert graph.module("lm").weights == graph.module("lm").hf == str(tmp_path / "llama")
    message = errors(tmp_path, declared.replace("norm_eps = 1e-5, ", "") + LM_TASK)
    assert "module 'lm' does not match \"llama\": norm_eps = 1e-06 here" in message
    assert "rms_norm_eps = 1e-05" in message


def test_folders_and_strings_that_are_not_models(tmp_path) -> None:
    message = errors(tmp_path, 'module lm : hf("nowhere")\n' + LM_TASK)
    assert "nowhere is not a folder" in message
    (tmp_path / "empty").mkdir()
    assert "config.json does not exist" in errors(tmp_path, 'module lm : hf("empty")\n' + LM_TASK)
    message = errors(tmp_path, 'module lm : mlp("x", in = 4, out = 4)\n' + LM_TASK)
    assert 'mlp() takes no folder string; only hf("DIR") reads one' in message
    assert "hf() needs the folder" in errors(tmp_path, "module lm : hf()\n" + LM_TASK)


def test_fmt_keeps_the_folder_first_with_its_comment() -> None:
    text = (
        'module lm : hf(\n  "models/x",   # the folder\n  # why\n  output = "cls",\n) <- image\n'
        'module b : hf( "y" )  # short\n'
    )
    formatted = format_spec(parse(text))
    assert formatted == (
        'module lm : hf(\n  "models/x",  # the folder\n  # why\n  output = "cls",\n) <- image\n'
        'module b : hf("y")  # short\n'
    )
    assert format_spec(parse(formatted)) == formatted and parse(formatted) == parse(text)
