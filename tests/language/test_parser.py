"""Parsing: the AST, source positions, line wrapping, and named syntax errors."""

from __future__ import annotations

import pytest

from spindle_dsl.errors import SpecError
from spindle_dsl.language import parse
from spindle_dsl.language.ast import (
    ClusterDecl,
    Ident,
    MixDecl,
    ModalityDecl,
    ModuleDecl,
    Path,
    Setting,
    TaskDecl,
    Value,
)


def syntax_errors(text: str):
    with pytest.raises(SpecError) as info:
        parse(text, "s.spindle")
    return info.value.errors


def test_declarations_and_values():
    spec = parse(
        'cluster { devices = 16; device = "H100-80GB"; memory = 80GB; inter_bandwidth = 400Gb/s }\n'
        "modality text { tokens = 8  vocab = 100 }\n"
        "encoder e : transformer(layers = 2, hidden = 32, heads = 2, causal = true)"
        " <- text frozen\n"
        "task t { text[4] -> e; batch = 2; loss = mse }\n"
        "mix m { global_batch = 8; t = 0.5 }\n"
    )
    cluster, modality, module, task, mix = spec.decls
    assert isinstance(cluster, ClusterDecl)
    assert [s.value for s in cluster.settings] == [
        Value("int", 16),
        Value("string", "H100-80GB"),
        Value("size", 80, "GB"),
        Value("size", 400, "Gb/s"),
    ]
    assert isinstance(modality, ModalityDecl) and modality.name == Ident("text")
    assert isinstance(module, ModuleDecl)
    assert (module.keyword, module.kind.name, module.modality, module.frozen) == (
        "encoder",
        "transformer",
        Ident("text"),
        True,
    )
    assert module.args[-1] == Setting(Ident("causal"), Value("bool", True))
    assert isinstance(task, TaskDecl)
    assert task.body[0] == Path((Ident("text"), Ident("e")), Value("int", 4))
    assert task.settings[1].value == Value("name", "mse")
    assert isinstance(mix, MixDecl) and mix.settings[1].value == Value("float", 0.5)


def test_positions_are_one_based_with_exclusive_end():
    spec = parse("\n  module  proj : mlp(in = 3, out = 4)\n")
    (module,) = spec.modules
    assert (module.name.loc.line, module.name.loc.column, module.name.loc.end_column) == (2, 11, 15)
    assert (module.args[1].loc.column, module.args[1].loc.end_column) == (30, 37)


def test_locations_do_not_take_part_in_equality():
    a = parse("task t { a -> b; batch = 1 }")
    b = parse("\n\ntask   t {\n    a ->\n      b\n  batch = 1\n}\n")
    assert a == b
    assert a.tasks[0].name.loc != b.tasks[0].name.loc


def test_lines_wrap_inside_brackets_and_after_operators():
    spec = parse(
        "shared llm : transformer(\n  layers = 2,\n  hidden = 8,\n  heads = 2,\n) <-\n  text\n"
        "task t {\n  text ->\n    llm\n  batch =\n    3\n}\n"
    )
    assert len(spec.modules[0].args) == 3 and spec.modules[0].modality == Ident("text")
    assert spec.tasks[0].paths[0].steps == (Ident("text"), Ident("llm"))
    assert spec.tasks[0].settings[0].value == Value("int", 3)


def test_comments_are_kept_for_fmt_but_not_in_the_tree():
    spec = parse("# head\nmodality m { tokens = 1 }  # tail\n")
    assert [(c.text, c.line) for c in spec.comments] == [("# head", 1), ("# tail", 2)]
    assert spec == parse("modality m { tokens = 1 }")


def test_crlf_and_byte_order_mark():
    assert parse("\ufefftask t {\r\n  a -> b\r\n}\r\n") == parse("task t {\n  a -> b\n}\n")


def test_negative_and_exponent_numbers():
    (s1, s2, s3) = parse("mix m { a = -2; b = 1e-3; c = 2.5e3 }").mixes[0].settings
    assert (s1.value, s2.value, s3.value) == (
        Value("int", -2),
        Value("float", 0.001),
        Value("float", 2500.0),
    )


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("task t { a }", 1, 12, "path (a -> b) or a setting"),
        ("modality m { tokens 3 }", 1, 21, "expected '='"),
        ("modality m { tokens = }", 1, 23, "value must follow"),
        ("module m : mlp(in = 1 out = 2)", 1, 23, "separated by ','"),
        ("module m mlp(in = 1)", 1, 10, "expected ':'"),
        ("task t { a -> }", 1, 15, "module after '->'"),
        ("task t { a[x] -> b }", 1, 12, "whole number in brackets"),
        ("modalty x { tokens = 1 }", 1, 1, "did you mean 'modality'"),
        ("task frozen { a -> b }", 1, 6, "keyword"),
        ("}", 1, 1, "unmatched '}'"),
        ("task t { a -> b", 1, 8, "never closed"),
        ("encoder e : vit(layers = 1\ntask t { a -> b }", 2, 1, "'(' on line 1 is never closed"),
        ('cluster { device = "A100 }', 1, 20, "unterminated string"),
        ("modality m { tokens = 1 } @", 1, 27, "unexpected character '@'"),
        ("module m : mlp(in = 99999999999999999999)", 1, 21, "too large"),
        ('cluster { device = "a\\qb" }', 1, 20, "unknown escape"),
    ],
)
def test_named_syntax_errors(text, line, column, words):
    first = syntax_errors(text)[0]
    assert (first.span.line, first.span.column) == (line, column), first.render(text)
    assert words in first.message, first.message


def test_unclosed_block_is_blamed_on_the_next_declaration():
    text = "task t {\n  a -> b\n\nmix m { global_batch = 1; t = 1 }\n"
    (error,) = syntax_errors(text)
    assert (error.span.line, error.span.column) == (4, 1)
    assert "task 't'" in error.message and "never closed" in error.message
    assert error.hint == "add '}' to close task 't' before line 4"


def test_every_independent_syntax_error_is_reported_in_source_order():
    text = (
        "modality m { tokens 3 }\n"  # 1: missing '='
        "task t {\n"
        "  a -> \n"  # 3: wraps onto line 4, where "batch = 2" is no module name
        "  batch = 2\n"
        "  loss lm\n"  # 5: missing '='
        "}\n"
        "module x : mlp(in = 1 out = 2)\n"  # 7: missing ','
    )
    errors = syntax_errors(text)
    assert [e.span.line for e in errors] == [1, 4, 5, 7]
    assert all(e.severity == "error" for e in errors)


def test_a_bad_character_does_not_cascade():
    errors = syntax_errors("modality m { tokens = 1€2 }\nmodality n { tokens 2 }\n")
    assert [(e.span.line, "character" in e.message) for e in errors] == [(1, True), (2, False)]


def test_empty_and_comment_only_files_parse():
    assert parse("").decls == ()
    assert parse("# nothing here\n\n").decls == ()
