"""The ``train`` block, the modules' ``lr_scale`` and the command line's overrides, resolved to
the run's ``TrainSettings``.

Precedence is command line over file over defaults, setting by setting, as for the cluster.
Each setting is checked where it is written (its type, its range, a decay that exists, a key
that exists, with the closest known key when it does not); the settings that only make sense
together (a warmup no longer than the run, ``min_lr`` at most ``lr``) are checked on the merged
values and reported at the spec's setting when the file gave it, else by the flag's name, so
``--steps 3`` on a spec with ``warmup_steps = 5`` names both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from spindle_dsl.language.ast import Loc, ModuleDecl, Setting, Spec, Value
from spindle_dsl.language.reporter import Reporter
from spindle_dsl.language.suggest import did_you_mean
from spindle_dsl.recipe import DEFAULTS, LR_DECAYS, TrainSettings

# The settings a train block takes and what each is: "int" counts from the minimum given,
# "float" numbers from their minimum (``open``: strictly greater) up to a maximum.
_INTS: dict[str, int] = {
    "steps": 1,
    "warmup_steps": 0,
    "seed": 0,
    "eval_every": 0,
    "eval_batches": 1,
    "checkpoint_every": 0,
    "keep_checkpoints": 0,
}
# (minimum, strictly greater than it, maximum or None)
_FLOATS: dict[str, tuple[float, bool, float | None]] = {
    "lr": (0.0, True, None),
    "min_lr": (0.0, False, None),
    "weight_decay": (0.0, False, None),
    "beta1": (0.0, False, 1.0),
    "beta2": (0.0, False, 1.0),
    "eps": (0.0, True, None),
    "clip_grad": (0.0, False, None),
}
KEYS = tuple(f.name for f in fields(TrainSettings) if f.name != "lr_scales")
MODULE_OPTIONS = ("lr_scale",)
# Counts beyond these are typos: the longest published runs take a few million steps, and a
# seed is a 63-bit integer (torch's generators take no more).
_MAX_INT = {"seed": 2**63 - 1}
_MAX_COUNT = 10**12
HINT = "a train block takes " + ", ".join(KEYS) + ' (lr_decay = "constant", "linear" or "cosine")'


def resolve_train(
    spec: Spec, r: Reporter, overrides: Mapping[str, Any] | None = None
) -> TrainSettings | None:
    """The run's settings from the spec's train block and module options, with ``overrides``
    (``TrainSettings`` field names) on top; None after reporting an error."""
    blocks = spec.trains
    for extra in blocks[1:]:
        r.error(
            "a spec has one train block; this is the second",
            extra.loc.head(len("train")),
            hint=f"merge it into the train block on line {blocks[0].loc.line}",
        )
    given = _read_block(blocks[0].settings if blocks else (), r)
    scales = _lr_scales(spec.modules, r)
    cli = _check_overrides(dict(overrides or {}), r)
    if given is None or scales is None or cli is None:
        return None
    values = {k: v for k, (v, _) in given.items()}
    merged = {**{f.name: getattr(DEFAULTS, f.name) for f in fields(DEFAULTS)}, **values, **cli}
    merged["lr_scales"] = scales
    places = {k: loc for k, (_, loc) in given.items() if k not in cli}
    if not _check_together(merged, places, set(cli), r):
        return None
    if merged["lr_decay"] == "constant" and "min_lr" in places:
        r.warning(
            'min_lr has no effect with lr_decay = "constant"',
            places["min_lr"],
            hint='set lr_decay = "linear" or "cosine" to decay to it',
        )
    return TrainSettings(**merged)


def _read_block(settings: tuple[Setting, ...], r: Reporter) -> dict[str, tuple[Any, Loc]] | None:
    """The block's settings by key, each with the place it was written."""
    out: dict[str, tuple[Any, Loc]] = {}
    seen: set[str] = set()
    ok = True
    for s in settings:
        key = s.key.name
        if key not in KEYS:
            r.error(f"unknown train setting '{key}'{did_you_mean(key, KEYS)}", s.key.loc, HINT)
            ok = False
            continue
        if key in seen:
            r.error(f"'{key}' is set twice in the train block", s.key.loc)
            ok = False
            continue
        seen.add(key)
        value = _read(key, s.value, s.loc, r)
        if value is None:
            ok = False
        else:
            out[key] = (value, s.loc)
    return out if ok else None


def _read(key: str, v: Value, at: Loc, r: Reporter) -> Any:
    """One setting's value, or None after reporting why it cannot be."""
    if key == "lr_decay":
        word = r.word(v, "lr_decay")
        if word is not None and word not in LR_DECAYS:
            r.error(
                f"unknown lr_decay '{word}'{did_you_mean(word, LR_DECAYS)}",
                v.loc,
                hint='lr_decay is "constant", "linear" or "cosine"',
            )
            return None
        return word
    if key in _INTS:
        if v.kind != "int":
            r.error(f"{key} must be a whole number, got {v.describe()}", v.loc)
            return None
        number: int | float = int(v.value)
    elif v.kind not in ("int", "float"):
        r.error(f"{key} must be a number, got {v.describe()}", v.loc)
        return None
    else:
        number = float(v.value)
    problem = range_problem(key, number)
    if problem is not None:
        r.error(f"{key} {problem}", at)
        return None
    return number


def range_problem(key: str, number: float) -> str | None:
    """Why ``number`` cannot be setting ``key`` ("must be ..."), or None."""
    if key in _INTS:
        low, high = _INTS[key], _MAX_INT.get(key, _MAX_COUNT)
        if number < low:
            return f"must be at least {low}, got {number}"
        if number > high:
            return f"must be at most {high:,}, got {number}"
        return None
    low, strict, top = _FLOATS[key]
    if number != number or number in (float("inf"), float("-inf")):
        return f"must be a finite number, got {number}"
    if strict and number <= low:
        return f"must be greater than {low:g}, got {number:g}"
    if number < low:
        return f"must not be negative, got {number:g}"
    if top is not None and number >= top:
        return f"must be less than {top:g}, got {number:g}"
    return None


def _lr_scales(modules: list[ModuleDecl], r: Reporter) -> tuple[tuple[str, float], ...] | None:
    """Each module's ``lr_scale`` (modules without one are left out), by module name."""
    out: list[tuple[str, float]] = []
    ok = True
    for m in modules:
        seen: set[str] = set()
        for s in m.options:
            key = s.key.name
            if key not in MODULE_OPTIONS:
                r.error(
                    f"unknown module option '{key}'{did_you_mean(key, MODULE_OPTIONS)}",
                    s.key.loc,
                    hint="a module declaration may end with lr_scale = FACTOR",
                )
                ok = False
            elif key in seen:
                r.error(f"'{key}' is set twice on module '{m.name.name}'", s.key.loc)
                ok = False
            else:
                seen.add(key)
                scale = r.positive(s.value, f"lr_scale of module '{m.name.name}'", at=s.loc)
                if scale is None:
                    ok = False
                    continue
                if m.frozen:
                    r.warning(
                        f"lr_scale of module '{m.name.name}' has no effect: it is frozen",
                        s.loc,
                    )
                out.append((m.name.name, scale))
    return tuple(sorted(out)) if ok else None


def flag(key: str) -> str:
    """The ``spindle train`` flag that overrides setting ``key``."""
    return "--" + key.replace("_", "-")


def _check_overrides(overrides: dict[str, Any], r: Reporter) -> dict[str, Any] | None:
    """Command-line overrides (no source location): known keys, values of the right range."""
    ok = True
    for key, value in overrides.items():
        if key not in KEYS:
            r.error(f"unknown train setting override '{key}'{did_you_mean(key, KEYS)}")
            ok = False
        elif key == "lr_decay":
            if value not in LR_DECAYS:
                r.error(
                    f"unknown lr_decay '{value}' in {flag(key)}"
                    f"{did_you_mean(str(value), LR_DECAYS)}",
                    hint="lr_decay is constant, linear or cosine",
                )
                ok = False
        elif isinstance(value, bool) or not isinstance(value, int | float):
            r.error(f"{flag(key)} must be a number, got {value!r}")
            ok = False
        elif key in _INTS and not isinstance(value, int):
            r.error(f"{flag(key)} must be a whole number, got {value!r}")
            ok = False
        else:
            problem = range_problem(key, value)
            if problem is not None:
                r.error(f"{flag(key)} {problem}")
                ok = False
    return overrides if ok else None


def _check_together(
    merged: dict[str, Any], places: dict[str, Loc], flags: set[str], r: Reporter
) -> bool:
    """The checks of two settings at once; each error points at the spec's setting where the
    file gave it, and names the flag where the command line did."""

    def named(key: str) -> str:
        return f"{flag(key)} {merged[key]:g}" if key in flags else f"{key} = {merged[key]:g}"

    def place(*keys: str) -> Loc | None:
        return next((places[k] for k in keys if k in places), None)

    ok = True
    if merged["warmup_steps"] > merged["steps"]:
        r.error(
            f"{named('warmup_steps')} is longer than the run ({named('steps')})",
            place("warmup_steps", "steps"),
            hint="shorten the warmup or train for more steps",
        )
        ok = False
    if merged["min_lr"] > merged["lr"]:
        r.error(
            f"{named('min_lr')} is above the learning rate ({named('lr')})",
            place("min_lr", "lr"),
            hint="the decay ends at min_lr: make it at most lr",
        )
        ok = False
    return ok
