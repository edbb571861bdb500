"""The acceptance criteria on the reference spec fixtures and on the examples.

The fixtures are the suite's copy (``tests/fixtures/spec``, the ``spec_dir`` fixture): the
workloads must check clean and lower as the examples do, each broken spec must give the error its
first line names, and the specs of ``next/`` that the language accepts must check clean. Specs a
shared folder beside the checkout has and the copy lacks are checked the same way, as extra cases.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from specfixtures import SHARED_SPEC_DIR, SPEC_DIR, extra_shared_specs

from spindle_dsl.errors import SpecError
from spindle_dsl.language import compile_file, format_spec, parse

_spec = importlib.util.spec_from_file_location(
    "lang_helpers", Path(__file__).with_name("helpers.py")
)
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)

GOOD = ["tiny_mm", "multitask_clip", "qwen_val", "tiny_schedule"]
# Fixtures of next/ that the language accepts (NEXT), and those in syntax it does not accept
# yet (AHEAD), which stay out of the checks that must pass clean.
NEXT = ["llama2_7b", "tiny_schedule", "tiny_recipe"]
AHEAD: list[str] = []


def fixture(spec_dir: Path, name: str) -> Path:
    return spec_dir / ("next" if name in NEXT else "") / f"{name}.spindle"


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

# Every reference fixture that must check clean: the workloads the examples mirror (GOOD) and
# cpu_medium, plus the specs a shared folder beside the checkout has and the copy lacks.
CLEAN = [fixture(SPEC_DIR, name) for name in (*GOOD, "cpu_medium")] + extra_shared_specs()
CLEAN_IDS = [p.stem if p.is_relative_to(SPEC_DIR) else f"shared:{p.stem}" for p in CLEAN]


@pytest.mark.parametrize("path", CLEAN, ids=CLEAN_IDS)
def test_reference_fixture_checks_clean(path):
    compiled = compile_file(path)
    assert compiled.warnings == ()
    assert len(compiled.graph) > 0


def test_every_fixture_is_covered(spec_dir):
    """A spec added to the copy must join a list here, so that it is checked."""
    assert {p.stem for p in spec_dir.glob("*.spindle")} == {*GOOD, "cpu_medium"} - set(NEXT)
    assert {p.stem for p in (spec_dir / "next").glob("*.spindle")} == {*NEXT, *AHEAD}
    assert {p.stem for p in (spec_dir / "broken").glob("*.spindle")} == set(BROKEN), (
        "add new broken fixtures to BROKEN"
    )


def _without_comment_lines(text: str) -> list[str]:
    """The lines that make the spec: full-line comments dropped, a broken spec's ``# expect:``
    line kept (the copy words its comments for the suite)."""
    return [
        line
        for line in text.splitlines()
        if not line.lstrip().startswith("#") or line.startswith("# expect:")
    ]


def test_the_copy_matches_a_shared_folder_beside_the_checkout(spec_dir):
    """Where ``../shared/spec`` has a spec of the same name, the copy is that spec up to its
    comment lines (so the suite checks the reference workloads as they stand); with no shared
    folder there is nothing to compare."""
    for ours in sorted(spec_dir.rglob("*.spindle")):
        theirs = SHARED_SPEC_DIR / ours.relative_to(spec_dir)
        if theirs.is_file():
            assert _without_comment_lines(ours.read_text()) == _without_comment_lines(
                theirs.read_text()
            ), f"copy {theirs} to {ours}"


@pytest.mark.parametrize("name", NEXT)
def test_next_fixture_checks_clean_and_formats(spec_dir, name):
    path = spec_dir / "next" / f"{name}.spindle"
    compiled = compile_file(path)
    assert compiled.warnings == ()
    assert len(compiled.graph) > 0
    spec = parse(path.read_text())
    once = format_spec(spec)
    assert parse(once) == spec
    assert format_spec(parse(once)) == once


def test_fixtures_ahead_of_the_language_are_still_refused(spec_dir):
    """Once the language accepts one, it moves to NEXT and the clean checks take it up (a
    loop, not a parametrization: with AHEAD empty there is nothing to check, not a skip)."""
    for name in AHEAD:
        with pytest.raises(SpecError):
            compile_file(spec_dir / "next" / f"{name}.spindle")


BROKEN_PATHS = [SPEC_DIR / "broken" / f"{name}.spindle" for name in BROKEN]
BROKEN_PATHS += extra_shared_specs("broken")


@pytest.mark.parametrize("path", BROKEN_PATHS, ids=[p.stem for p in BROKEN_PATHS])
def test_broken_fixture_first_error(path):
    """``path`` fails with the error its ``# expect: LINE[:COL] WORD...`` line names first."""
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


@pytest.mark.parametrize("path", CLEAN, ids=CLEAN_IDS)
def test_fmt_round_trips_and_is_idempotent_on_fixtures(path):
    text = path.read_text()
    spec = parse(text)
    once = format_spec(spec)
    assert parse(once) == spec
    assert format_spec(parse(once)) == once
    assert once.count("#") == text.count("#")  # no comment lost


def test_fmt_round_trips_broken_fixtures_that_parse():
    for path in BROKEN_PATHS:
        try:
            spec = parse(path.read_text())
        except SpecError:
            continue  # a syntax error: nothing to format
        once = format_spec(spec)
        assert parse(once) == spec, path.name
        assert format_spec(parse(once)) == once, path.name


@pytest.mark.parametrize("name", GOOD)
def test_examples_lower_to_the_fixtures_graphs(spec_dir, name):
    ours = compile_file(helpers.EXAMPLES / f"{name}.spindle")
    theirs = compile_file(fixture(spec_dir, name))
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
