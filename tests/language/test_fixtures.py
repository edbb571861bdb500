"""The acceptance criteria on the shared fixtures and on the examples."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from spindle_dsl.errors import SpecError
from spindle_dsl.language import compile_file, format_spec, parse

_spec = importlib.util.spec_from_file_location(
    "lang_helpers", Path(__file__).with_name("helpers.py")
)
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)

GOOD = ["tiny_mm", "multitask_clip", "qwen_val", "tiny_schedule"]
# Fixtures of spec/next/ that the language accepts now (the others await their issues).
NEXT = ["llama2_7b", "tiny_schedule"]


def fixture(shared_dir: Path, name: str) -> Path:
    return shared_dir / "spec" / ("next" if name in NEXT else "") / f"{name}.spindle"


BROKEN = [
    "bad_mix",
    "cycle",
    "duplicate_name",
    "negative_value",
    "no_batch",
    "unclosed_block",
    "unknown_module",
    "width_mismatch",
]


@pytest.mark.parametrize("name", GOOD)
def test_shared_fixture_checks_clean(shared_dir, name):
    compiled = compile_file(fixture(shared_dir, name))
    assert compiled.warnings == ()
    assert len(compiled.graph) > 0


@pytest.mark.parametrize("name", NEXT)
def test_next_fixture_checks_clean_and_formats(shared_dir, name):
    path = shared_dir / "spec" / "next" / f"{name}.spindle"
    compiled = compile_file(path)
    assert compiled.warnings == ()
    assert len(compiled.graph) > 0
    spec = parse(path.read_text())
    once = format_spec(spec)
    assert parse(once) == spec
    assert format_spec(parse(once)) == once


def test_every_broken_fixture_is_covered(shared_dir):
    on_disk = {p.stem for p in (shared_dir / "spec" / "broken").glob("*.spindle")}
    assert on_disk == set(BROKEN), "add new broken fixtures to BROKEN"


@pytest.mark.parametrize("name", BROKEN)
def test_broken_fixture_first_error(shared_dir, name):
    path = shared_dir / "spec" / "broken" / f"{name}.spindle"
    text = path.read_text()
    line, column, words = helpers.expectation(text)
    with pytest.raises(SpecError) as info:
        compile_file(path)
    first = info.value.errors[0]
    assert first.span is not None and first.span.path == str(path)
    assert first.span.line == line, first.render(text)
    if column is not None:
        assert first.span.column == column, first.render(text)
    for word in words:
        assert word.lower() in first.message.lower(), first.render(text)
    rendered = info.value.render()
    assert f"{path}:{line}:" in rendered and "^" in rendered


@pytest.mark.parametrize("name", GOOD)
def test_fmt_round_trips_and_is_idempotent_on_fixtures(shared_dir, name):
    text = fixture(shared_dir, name).read_text()
    spec = parse(text)
    once = format_spec(spec)
    assert parse(once) == spec
    assert format_spec(parse(once)) == once
    assert once.count("#") == text.count("#")  # no comment lost


def test_fmt_round_trips_broken_fixtures_that_parse(shared_dir):
    for path in (shared_dir / "spec" / "broken").glob("*.spindle"):
        try:
            spec = parse(path.read_text())
        except SpecError:
            continue  # a syntax error: nothing to format
        once = format_spec(spec)
        assert parse(once) == spec, path.name
        assert format_spec(parse(once)) == once, path.name


@pytest.mark.parametrize("name", GOOD)
def test_examples_lower_to_the_fixtures_graphs(shared_dir, name):
    ours = compile_file(helpers.EXAMPLES / f"{name}.spindle")
    theirs = compile_file(fixture(shared_dir, name))
    assert ours.warnings == ()

    def bare(graph):
        return dataclasses.replace(graph, spec_path="", spec_sha256="")

    assert bare(ours.graph) == bare(theirs.graph)
    if theirs.schedule is not None:
        pairs = zip(ours.schedule.phases, theirs.schedule.phases, strict=True)
        assert all(bare(a.graph) == bare(b.graph) for a, b in pairs)


@pytest.mark.parametrize("name", GOOD)
def test_examples_are_canonical(name):
    text = (helpers.EXAMPLES / f"{name}.spindle").read_text()
    assert format_spec(parse(text)) == text
