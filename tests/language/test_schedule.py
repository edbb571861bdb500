"""The ``schedule`` block: parsing, checks at their place, warnings, fmt, and phase graphs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from spindle_dsl.errors import SpecError
from spindle_dsl.language import compile_text, format_spec, parse

_spec = importlib.util.spec_from_file_location(
    "lang_helpers", Path(__file__).with_name("helpers.py")
)
h = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(h)

MIXES = """\
mix solo  { global_batch = 8; chat = 1 }
mix both  { global_batch = 12; caption = 1; chat = 2 }
"""
BASE = h.BASE + MIXES  # mixes on lines 8 (default), 9 (solo), 10 (both)


def spec(schedule: str, base: str = BASE) -> str:
    return base + schedule + "\n"


def test_a_schedule_lowers_a_graph_per_phase_and_selects_its_first_mix():
    c = compile_text(spec("schedule { 0: solo; 2: both; 5: default }"))
    assert c.warnings == ()
    assert c.graph.mix == "solo" and [t.name for t in c.graph.tasks] == ["chat"]
    phases = c.schedule.phases
    assert [(p.first_step, p.mix) for p in phases] == [(0, "solo"), (2, "both"), (5, "default")]
    assert phases[0].graph is c.graph
    assert {t.name: t.batch for t in phases[1].graph.tasks} == {"caption": 4, "chat": 8}
    # every phase's modules have the same parameters where they are present
    params = {}
    for p in phases:
        for m in p.graph.modules:
            assert params.setdefault(m.name, m.params) == m.params, m.name
    assert c.schedule.index_at(0) == 0 and c.schedule.index_at(4) == 1
    assert c.schedule.at(99).mix == "default"


def test_without_a_schedule_nothing_changes_and_a_named_mix_sets_it_aside():
    plain = compile_text(BASE)
    assert plain.schedule is None and plain.graph.mix == "default"
    named = compile_text(spec("schedule { 0: solo; 2: both }"), mix="both")
    assert named.schedule is None and named.graph.mix == "both"


def test_sample_positions_advance_by_the_batches_a_task_took():
    c = compile_text(spec("schedule { 0: solo; 2: both; 5: solo }"))
    s = c.schedule
    # caption: absent for steps 0-1, 4 a step for 2-4, absent from 5 on
    assert [s.first_sample("caption", k) for k in range(8)] == [0, 0, 0, 4, 8, 12, 12, 12]
    assert [s.first_sample("chat", k) for k in range(7)] == [0, 8, 16, 24, 32, 40, 48]


def test_the_input_stages_are_sized_for_every_phase():
    text = h.BASE.replace("task chat    { text -> lm }", "task chat    { text[3] -> lm }")
    text += "mix short { global_batch = 4; chat = 1 }\n"
    alone = compile_text(text, mix="short").graph
    assert dict(alone.module("lm").raw_inputs) == {"text": 3}  # no schedule: as before
    c = compile_text(text + "schedule { 0: short; 1: default }\n")
    for p in c.schedule.phases:
        assert dict(p.graph.module("lm").raw_inputs) == {"text": 8}, p.mix


# (schedule block, line and column of the first error, words in its message)
BROKEN = [
    ("schedule { 1: solo }", 11, 12, "first entry must be at step 0"),
    ("schedule { 0: solo; 3: both; 3: default }", 11, 30, "step 3 must come after step 3"),
    ("schedule { 0: solo; 4: both; 2: default }", 11, 30, "after step 4"),
    ("schedule { 0: solo; 2: bth }", 11, 24, "unknown mix 'bth'|did you mean 'both'"),
    ("schedule { 0: solo; 2.5: both }", 11, 21, "whole number"),
    ("schedule { 0: solo; -1: both }", 11, 21, "at least 0"),
    ("schedule {}", 11, 1, "lists no mix"),
    ("schedule { 0: solo }\nschedule { 0: both }", 12, 1, "one schedule|line 11"),
    ("schedule { 0: solo; 2 both }", 11, 23, "STEP: MIX"),
    ("schedule s { 0: solo }", 11, 10, "no name"),
]


@pytest.mark.parametrize(("block", "line", "column", "words"), BROKEN)
def test_schedule_errors_point_at_their_place(block, line, column, words):
    text = spec(block)
    d = h.first_error(text)
    assert h.where(d) == (line, column), d.render(text)
    for word in words.split("|"):
        assert word.lower() in d.message.lower(), d.render(text)
    assert "^" in d.render(text)


def test_every_schedule_error_is_reported_in_one_run():
    errors = h.errors_of(spec("schedule { 2: sol; 1: both }"))
    messages = " / ".join(e.message for e in errors)
    assert "first entry must be at step 0" in messages and "unknown mix 'sol'" in messages


def test_a_task_in_no_phase_is_a_warning_and_a_repeated_mix_too():
    c = compile_text(spec("schedule { 0: solo; 3: solo }"))
    rendered = c.render_warnings()
    assert "task 'caption' is in no phase of the schedule" in rendered
    assert "follows itself" in rendered
    assert [(p.first_step, p.mix) for p in c.schedule.phases] == [(0, "solo")]
    # a task only a later phase trains draws no warning about the first phase's mix
    later = compile_text(spec("schedule { 0: solo; 3: both }"))
    assert later.warnings == ()


def test_schedule_is_a_keyword():
    with pytest.raises(SpecError, match="'schedule' is a keyword"):
        parse("mix schedule { global_batch = 2 }")


def test_fmt_keeps_the_schedule_and_its_comments():
    text = spec("schedule {   # when\n  0:solo\n  # then both\n\n  2 : both  # two\n}")
    out = format_spec(parse(text))
    assert out.endswith("schedule {  # when\n  0: solo\n  # then both\n\n  2: both  # two\n}\n"), (
        out
    )
    assert parse(out) == parse(text) and format_spec(parse(out)) == out
    one = format_spec(parse(spec("schedule{0:solo;2:both}")))
    assert one.endswith("schedule { 0: solo; 2: both }\n")
