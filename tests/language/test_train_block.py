"""The ``train`` block and the modules' ``lr_scale``: resolved settings, overrides, errors at
their place, ``spindle check``'s summary and ``spindle fmt``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from spindle_dsl.language import compile_text, format_spec, parse
from spindle_dsl.language.summary import render_summary, summarize
from spindle_dsl.recipe import DEFAULTS, TrainSettings, lr_at

_spec = importlib.util.spec_from_file_location(
    "lang_helpers", Path(__file__).with_name("helpers.py")
)
h = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(h)

BLOCK = """\
train {
  steps        = 40
  lr           = 3e-4
  warmup_steps = 5
  lr_decay     = "cosine"
  min_lr       = 3e-5
  clip_grad    = 1.0
}
"""  # lines 9-16 after BASE's 8


def with_block(block: str = BLOCK, base: str = h.BASE) -> str:
    return base + block


def test_the_block_and_lr_scale_resolve_over_the_defaults():
    text = with_block().replace("mlp(in = 32, out = 64)", "mlp(in = 32, out = 64) lr_scale = 0.1")
    c = compile_text(text)
    assert c.warnings == ()
    assert c.train == TrainSettings(
        steps=40,
        lr=3e-4,
        warmup_steps=5,
        lr_decay="cosine",
        min_lr=3e-5,
        clip_grad=1.0,
        lr_scales=(("proj", 0.1),),
    )
    assert compile_text(h.BASE).train == DEFAULTS


def test_overrides_win_setting_by_setting():
    c = compile_text(with_block(), train_overrides={"steps": 6, "warmup_steps": 3, "lr": 1e-2})
    assert (c.train.steps, c.train.warmup_steps, c.train.lr) == (6, 3, 1e-2)
    assert c.train.lr_decay == "cosine" and c.train.min_lr == 3e-5


@pytest.mark.parametrize(
    ("old", "new", "at", "words"),
    [
        (
            "warmup_steps = 5",
            "warmup_step = 5",
            (12, 3),
            ["unknown", "did you mean 'warmup_steps'"],
        ),
        ("warmup_steps = 5", "warmup_steps = 50", (12, 3), ["warmup_steps = 50", "longer"]),
        ("lr           = 3e-4", "lr = -3e-4", (11, 3), ["lr must be greater than 0"]),
        ("min_lr       = 3e-5", "min_lr = 3e-3", (14, 3), ["min_lr = 0.003", "above"]),
        ('"cosine"', '"cosin"', (13, 18), ["unknown lr_decay 'cosin'", "'cosine'"]),
        ('"cosine"', "cosine", None, []),  # a bare word is fine
        ("steps        = 40", "steps = 4.5", (10, 11), ["whole number"]),
        ("clip_grad    = 1.0", "clip_grad = -1", (15, 3), ["must not be negative"]),
        ("clip_grad    = 1.0", "steps = 3", (15, 3), ["set twice"]),
    ],
)
def test_errors_in_the_block_are_at_their_place(old, new, at, words):
    text = with_block(BLOCK.replace(old, new))
    if at is None:
        assert compile_text(text).train.lr_decay == "cosine"
        return
    error = h.first_error(text)
    assert h.where(error) == at, error.render(text)
    for word in words:
        assert word in error.message, error.message


def test_an_override_that_clashes_with_the_block_names_both():
    error = h.first_error(with_block(), train_overrides={"steps": 3})
    assert h.where(error) == (12, 3)  # the spec's warmup_steps
    assert "warmup_steps = 5" in error.message and "--steps 3" in error.message
    flagged = h.first_error(h.BASE, train_overrides={"lr_decay": "cosin"})
    assert flagged.span is None and "--lr-decay" in flagged.message and "cosine" in flagged.message
    both = h.first_error(h.BASE, train_overrides={"warmup_steps": 20})
    assert "--warmup-steps 20" in both.message and "steps = 10" in both.message


def test_module_options_and_a_second_block():
    text = with_block().replace("mlp(in = 32, out = 64)", "mlp(in = 32, out = 64) lr_scal = 2")
    error = h.first_error(text)
    assert h.where(error) == (4, 41) and "did you mean 'lr_scale'" in error.message
    bad = with_block().replace("mlp(in = 32, out = 64)", "mlp(in = 32, out = 64) lr_scale = 0")
    assert "lr_scale of module 'proj' must be greater than 0" in h.first_error(bad).message
    twice = h.first_error(with_block() + "train { steps = 3 }\n")
    assert h.where(twice) == (17, 1) and "one train block" in twice.message
    named = h.first_error(h.BASE + "train t { steps = 3 }\n")
    assert "train block has no name" in named.message


def test_min_lr_without_a_decay_is_a_warning():
    c = compile_text(h.BASE + "train { min_lr = 1e-5 }\n")
    assert [w.message for w in c.warnings if "min_lr" in w.message] == [
        'min_lr has no effect with lr_decay = "constant"'
    ]


def test_check_prints_the_resolved_settings_and_json_keeps_them():
    c = compile_text(with_block().replace("out = 64)", "out = 64) lr_scale = 0.5"))
    data = summarize(c.graph, [], c.schedule, c.train)
    assert data["train"]["warmup_steps"] == 5 and data["train"]["lr_scales"] == {"proj": 0.5}
    text = render_summary(data)
    assert 'lr_decay = "cosine"' in text and "clip_grad = 1" in text
    assert "lr_scale proj = 0.5" in text


def test_fmt_formats_the_block_and_keeps_its_comments():
    text = h.BASE.replace("out = 64)", "out = 64)   lr_scale=0.5 # slower") + (
        "train {  # the recipe\n  steps=40\n  # peak rate\n  lr = 3e-4   # AdamW\n}\n"
    )
    spec = parse(text)
    once = format_spec(spec)
    assert parse(once) == spec and format_spec(parse(once)) == once
    assert once.count("#") == text.count("#")
    assert "mlp(in = 32, out = 64) lr_scale = 0.5  # slower" in once
    assert (
        "train {  # the recipe\n  steps = 40\n  # peak rate\n  lr    = 0.0003  # AdamW\n}" in once
    )


def test_the_schedule_warms_up_then_decays_to_min_lr_at_the_last_step():
    curve = [lr_at(s, lr=1.0, steps=6, warmup_steps=3, decay="cosine") for s in range(6)]
    assert curve == pytest.approx([1 / 3, 2 / 3, 1.0, 0.75, 0.25, 0.0])
    linear = [lr_at(s, lr=1.0, steps=4, decay="linear", min_lr=0.2) for s in range(4)]
    assert linear == pytest.approx([0.8, 0.6, 0.4, 0.2])
    assert [lr_at(s, lr=0.5, steps=3, warmup_steps=2) for s in range(3)] == [0.25, 0.5, 0.5]
