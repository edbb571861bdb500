"""Files a spec names: ``from "w.safetensors"`` on a module and ``data = "..."`` in a task.

Parsed into the AST, formatted back with comments, checked at the string that names them
(relative to the spec file), and carried into the MetaGraph as resolved paths; plus the rule
that a tied LM head needs exactly one vocab modality."""

from __future__ import annotations

import os

import pytest

from spindle_dsl.errors import SpecError
from spindle_dsl.language import compile_file, compile_text, format_spec, parse
from spindle_dsl.language.files import is_reference

SPEC = """\
cluster { devices = 2; device = "cpu" }
modality text { tokens = 8; vocab = 64 }
modality image { tokens = 4 }
encoder vision : vit(layers = 1, hidden = 16, heads = 2,
                     patch = 2) <- image frozen from "w/v.safetensors"  # tower
module proj : mlp(in = 16, out = 32)
shared lm : transformer(layers = 2, hidden = 32, heads = 4, causal = true,
                        vocab = 64) from "/ABS/lm.safetensors"
task caption {
  image -> vision -> proj -> lm
  text -> lm
  data = "data/caption"  # folder
}
task chat { text -> lm; data = "my_pkg.datasets:chat"; batch = 2 }
mix m { global_batch = 8; caption = 1; chat = 1 }
"""


@pytest.fixture
def spec_file(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "v.safetensors").write_bytes(b"")
    (tmp_path / "lm.safetensors").write_bytes(b"")
    (tmp_path / "data" / "caption").mkdir(parents=True)
    path = tmp_path / "s.spindle"
    path.write_text(SPEC.replace("/ABS", str(tmp_path)))
    return path


def test_from_and_data_parse_into_the_ast(spec_file):
    spec = parse(spec_file.read_text())
    vision, _, lm = spec.modules
    assert vision.frozen and vision.weights.value == "w/v.safetensors"
    assert vision.modality.name == "image"
    assert lm.weights.value.endswith("/lm.safetensors") and not lm.frozen
    assert spec.modules[1].weights is None
    caption = spec.tasks[0]
    data = next(s for s in caption.settings if s.key.name == "data")
    assert data.value.kind == "string" and data.value.value == "data/caption"


def test_fmt_keeps_from_and_data_and_comments(spec_file):
    text = spec_file.read_text()
    once = format_spec(parse(text))
    assert parse(once) == parse(text)
    assert format_spec(parse(once)) == once
    assert once.count("#") == text.count("#")
    assert 'frozen from "w/v.safetensors"  # tower' in once
    assert 'data = "data/caption"  # folder' in once


def test_paths_resolve_against_the_spec_file(spec_file, monkeypatch):
    monkeypatch.chdir("/")  # the working directory does not matter
    graph = compile_file(spec_file).graph
    folder = spec_file.parent
    assert graph.module("vision").weights == str(folder / "w" / "v.safetensors")
    assert graph.module("lm").weights == str(folder / "lm.safetensors")
    assert graph.module("proj").weights is None
    assert graph.task("caption").data == str(folder / "data" / "caption")
    assert graph.task("chat").data == "my_pkg.datasets:chat"


def _errors(text: str, path: str) -> list:
    with pytest.raises(SpecError) as info:
        compile_text(text, path)
    return info.value.errors


def test_missing_files_are_errors_at_their_strings(spec_file):
    text = spec_file.read_text()
    os.remove(spec_file.parent / "w" / "v.safetensors")
    (spec_file.parent / "data" / "caption").rmdir()
    errors = _errors(text, str(spec_file))
    assert len(errors) == 2
    weights, data = errors
    line5 = text.splitlines()[4]
    assert (weights.span.line, weights.span.column) == (5, line5.index('"w/v') + 1)
    assert "weights file" in weights.message and "not found" in weights.message
    assert str(spec_file.parent / "w" / "v.safetensors") in weights.message
    assert (data.span.line, data.span.column) == (12, text.splitlines()[11].index('"data') + 1)
    assert "data of task 'caption'" in data.message and "not found" in data.message


def test_a_folder_is_not_a_weights_file_and_data_must_be_a_string(spec_file):
    text = spec_file.read_text().replace('"w/v.safetensors"', '"w"')
    text = text.replace('data = "my_pkg.datasets:chat"', "data = 3")
    messages = [e.message for e in _errors(text, str(spec_file))]
    assert any("a folder" in m for m in messages), messages
    assert any('quoted path or "package.module:function"' in m for m in messages), messages


def test_from_needs_a_string_and_is_a_keyword():
    with pytest.raises(SpecError) as info:
        parse("module m : mlp(in = 1, out = 1) from w\n")
    assert "weights file in quotes" in info.value.errors[0].message
    with pytest.raises(SpecError) as info:
        parse("module from : mlp(in = 1, out = 1)\n")
    assert "keyword" in info.value.errors[0].message


def test_declaration_may_wrap_after_from(tmp_path):
    (tmp_path / "w.safetensors").write_bytes(b"")
    path = tmp_path / "s.spindle"
    path.write_text(
        "modality f { tokens = 2; features = 3 }\n"
        "encoder e : mlp(in = 3, out = 3) <- f from\n"
        '  "w.safetensors"\n'
        "task t { f -> e; loss = mse; batch = 1 }\n"
    )
    assert compile_file(path).graph.module("e").weights == str(tmp_path / "w.safetensors")


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("pkg.mod:fn", True),
        ("mod:make_data", True),
        ("a.b.c:d", True),
        ("data/caption", False),
        ("pkg.mod:fn()", False),
        ("./x:y", False),
    ],
)
def test_reference_or_path(text, ref):
    assert is_reference(text) is ref


def test_tied_head_needs_exactly_one_vocab_modality():
    tied = (
        "transformer(layers = 1, hidden = 16, heads = 2, causal = true, vocab = 32, "
        "tie_embeddings = true)"
    )
    one = (
        "modality text { tokens = 4; vocab = 32 }\n"
        f"shared lm : {tied}\n"
        "task a { text -> lm; batch = 2 }\n"
    )
    assert compile_text(one).graph.module("lm").params > 0
    two = one + "modality code { tokens = 4; vocab = 32 }\ntask b { code -> lm; batch = 2 }\n"
    errors = _errors(two, "t.spindle")
    assert "exactly one token-id modality" in errors[0].message
    assert "code, text" in errors[0].message
    assert errors[0].span.line == 2
