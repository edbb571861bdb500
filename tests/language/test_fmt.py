"""``format_spec``: canonical, meaning-preserving, idempotent, and it keeps every comment."""

from __future__ import annotations

import pytest

from spindle_dsl.language import format_spec, parse


def fmt(text: str) -> str:
    out = format_spec(parse(text))
    assert parse(out) == parse(text), "formatting changed the meaning"
    assert format_spec(parse(out)) == out, "formatting is not idempotent"
    return out


def test_canonical_spacing_and_layout():
    text = (
        "cluster{devices=4;device='x'}\n".replace("'", '"')
        + "modality  text{tokens=8 vocab=100}\n"
        + "module m:mlp(in=1,out=2)frozen\n"
        + "task t{text[4]->m;batch=2\nloss=mse}\n"
    )
    assert fmt(text) == (
        'cluster { devices = 4; device = "x" }\n'
        "modality text { tokens = 8; vocab = 100 }\n"
        "module m : mlp(in = 1, out = 2) frozen\n"
        "task t {\n"
        "  text[4] -> m\n"
        "  batch = 2\n"
        "  loss  = mse\n"
        "}\n"
    )


def test_comments_stay_where_they_were():
    text = (
        "# file header\n"
        "\n"
        "task t {  # about t\n"
        "  # before the path\n"
        "  a -> b   # the path\n"
        "  batch = 1\n"
        "  # at the end of the block\n"
        "}  # after the block\n"
        "# the last word\n"
    )
    assert fmt(text) == (
        "# file header\n"
        "\n"
        "task t {  # about t\n"
        "  # before the path\n"
        "  a -> b  # the path\n"
        "  batch = 1\n"
        "  # at the end of the block\n"
        "}  # after the block\n"
        "# the last word\n"
    )


def test_blank_lines_collapse_to_one_and_edges_are_trimmed():
    assert fmt("\n\n\nmodality a { tokens = 1 }\n\n\n\nmodality b { tokens = 2 }\n\n") == (
        "modality a { tokens = 1 }\n\nmodality b { tokens = 2 }\n"
    )


def test_runs_of_declarations_align_and_blank_lines_end_runs():
    text = (
        "encoder e : vit(layers = 1, hidden = 8, heads = 2, patch = 2) <- img\n"
        "# a comment does not end the run\n"
        "module long_name : mlp(in = 8, out = 8)\n"
        "\n"
        "shared s : mlp(in = 8, out = 8)\n"
    )
    assert fmt(text) == (
        "encoder e         : vit(layers = 1, hidden = 8, heads = 2, patch = 2) <- img\n"
        "# a comment does not end the run\n"
        "module  long_name : mlp(in = 8, out = 8)\n"
        "\n"
        "shared s : mlp(in = 8, out = 8)\n"
    )


def test_long_module_breaks_one_argument_per_line_and_short_one_joins():
    args = ", ".join(f"arg{i} = {i}" for i in range(12))
    out = fmt(f"module m : k({args}) <- x\n")
    lines = out.splitlines()
    assert lines[0] == "module m : k(" and lines[-1] == ") <- x"
    assert lines[1] == "  arg0  = 0," and len(lines) == 14
    assert fmt("module m : k(\n  a = 1,\n  b = 2\n)\n") == "module m : k(a = 1, b = 2)\n"


def test_a_comment_inside_arguments_keeps_them_on_their_own_lines():
    out = fmt("module m : k(\n  a = 1,  # first\n  b = 2\n)\n")
    assert out == "module m : k(\n  a = 1,  # first\n  b = 2,\n)\n"


def test_one_line_blocks_stay_one_line_only_while_they_fit():
    short = "task t { a -> b; batch = 1 }\n"
    assert fmt(short) == short
    long = "task t { " + "; ".join(f"a{i} -> b{i}" for i in range(12)) + " }\n"
    assert fmt(long).count("\n") == 14


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("1.0", "1.0"),
        ("1e-5", "1e-05"),
        ("2.50", "2.5"),
        ("-3", "-3"),
        ('"a\\"b\\\\c"', '"a\\"b\\\\c"'),
        ("0.00001GB", "0.00001GB"),
        ("true", "true"),
        ("lm", "lm"),
    ],
)
def test_values_print_back_to_the_same_value(value, text):
    assert fmt(f"mix m {{ x = {value} }}\n") == f"mix m {{ x = {text} }}\n"


def test_trailing_comments_align_in_runs():
    out = fmt("modality a { tokens = 1 } # one\nmodality bbb { tokens = 22 }   # two\n")
    assert out == ("modality a   { tokens = 1 }   # one\nmodality bbb { tokens = 22 }  # two\n")
