"""Modality and module declarations: fields, kinds, kind arguments and modality bindings.

The kind registry is the only authority on what a kind accepts: this module hands it the
arguments as written and reports its answers at the argument they concern. A module whose
kind or arguments are wrong is left out of the result, and the task checks treat references
to it as known-but-unusable, so one bad declaration yields one error, not one per use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from spindle_dsl.kinds import get_kind, kind_names
from spindle_dsl.kinds.base import Kind
from spindle_dsl.language import limits
from spindle_dsl.language.ast import Loc, ModalityDecl, ModuleDecl, Setting
from spindle_dsl.language.check_hf import folder_weights, given_args, hf_kind
from spindle_dsl.language.files import spec_relative
from spindle_dsl.language.reporter import Reporter
from spindle_dsl.language.resolved import ResolvedModule
from spindle_dsl.language.suggest import did_you_mean
from spindle_dsl.metagraph import ModalityInfo

MODALITY_KEYS = ("tokens", "features", "vocab")
MODALITY_LIMITS = {"tokens": limits.TOKENS, "features": limits.FEATURES, "vocab": limits.VOCAB}
T = TypeVar("T")


def resolve_modalities(decls: list[ModalityDecl], r: Reporter) -> dict[str, ModalityInfo]:
    """The modalities whose fields are all valid, by name."""
    out: dict[str, ModalityInfo] = {}
    for d in decls:
        fields: dict[str, int] = {}
        seen: dict[str, Setting] = {}
        ok = True
        for s in d.settings:
            key = s.key.name
            if key not in MODALITY_KEYS:
                r.error(
                    f"unknown modality setting '{key}'{did_you_mean(key, MODALITY_KEYS)}",
                    s.key.loc,
                    hint="a modality takes tokens, and features or vocab",
                )
                ok = False
            elif key in seen:
                r.error(f"'{key}' is set twice in modality '{d.name.name}'", s.key.loc)
                ok = False
            else:
                seen[key] = s
                n = r.integer(
                    s.value,
                    f"{key} of modality '{d.name.name}'",
                    at=s.loc,
                    limit=MODALITY_LIMITS[key],
                )
                ok = ok and n is not None
                if n is not None:
                    fields[key] = n
        if "tokens" not in seen:
            r.error(f"modality '{d.name.name}' needs 'tokens = N' (tokens per sample)", d.name.loc)
            ok = False
        if "features" in seen and "vocab" in seen:
            later = max(seen["features"], seen["vocab"], key=lambda s: (s.loc.line, s.loc.column))
            r.error(
                f"modality '{d.name.name}' has features or a vocab, not both",
                later.loc,
                hint="features: float vectors per token; vocab: discrete token ids",
            )
            ok = False
        if ok:
            name = d.name.name
            out[name] = ModalityInfo(
                name, fields["tokens"], fields.get("features"), fields.get("vocab")
            )
    return out


def call_kind(r: Reporter, loc: Loc, kind: Kind, fn: Callable[..., T], *args: Any) -> T | None:
    """Call into a kind; a kind that raises (a user's kind with a bug) becomes one error."""
    try:
        return fn(*args)
    except Exception as exc:  # a user kind may raise anything; report it, never a traceback
        r.error(f"kind '{kind.name}' failed: {type(exc).__name__}: {exc}", loc)
        return None


def modality_problem(kind: Kind, args: dict[str, Any], info: ModalityInfo) -> str | None:
    """Why ``kind`` cannot read raw ``info`` data, or None. The kind decides first; the vocab
    rule is checked here as well so that a user's kind need not remember it."""
    reason = kind.reads_modality(args, info)
    if reason:
        return reason
    vocab = args.get("vocab")
    if info.vocab is not None and vocab is not None and vocab != info.vocab:
        return (
            f"{kind.name} has vocab = {vocab} but modality '{info.name}' has "
            f"vocab = {info.vocab}; they must agree"
        )
    return None


def resolve_modules(
    decls: list[ModuleDecl],
    r: Reporter,
    modalities: dict[str, ModalityInfo],
    modality_names: set[str],
) -> dict[str, ResolvedModule]:
    """The modules whose kind, arguments and binding are all valid, by name."""
    out: dict[str, ResolvedModule] = {}
    for d in decls:
        weights = _weights_file(d, r)
        resolved = _resolve_module(d, r, modalities, modality_names)
        if resolved is not None and weights is not False:
            found = folder_weights(d, resolved, weights, r)  # Hugging Face folders
            if found is not None:
                out[d.name.name] = replace(resolved, weights=found[0], hf=found[1])
    return out


def _weights_file(d: ModuleDecl, r: Reporter) -> str | bool | None:
    """The resolved path after ``from``, None without one, False after an error."""
    if d.weights is None:
        return None
    path = spec_relative(r.path, str(d.weights.value))
    if os.path.isfile(os.path.join(path, "config.json")):
        return path  # a Hugging Face folder (check_hf)
    if not os.path.isfile(path):
        what = "a folder" if os.path.isdir(path) else "not found"
        r.error(
            f"weights file {d.weights.describe()} of module '{d.name.name}': {what} "
            f"(looked for {path})",
            d.weights.loc,
            hint="name a .safetensors file or a Hugging Face folder, relative to the spec",
        )
        return False
    return path


def _resolve_module(
    d: ModuleDecl, r: Reporter, modalities: dict[str, ModalityInfo], modality_names: set[str]
) -> ResolvedModule | None:
    name = d.name.name
    hf = None
    if d.kind.name == "hf" or d.source is not None:  # a Hugging Face folder's config
        hf = hf_kind(d, r, modalities)
        if hf is None:
            _check_binding_name(d, r, modality_names)
            return None
    try:
        kind = get_kind(hf.model.kind if hf is not None else d.kind.name)
    except KeyError:
        known = (*kind_names(), "hf")
        r.error(
            f"unknown kind '{d.kind.name}'{did_you_mean(d.kind.name, known)}",
            d.kind.loc,
            hint="known kinds: " + ", ".join(known),
        )
        _check_binding_name(d, r, modality_names)
        return None
    given, ok = _given_args(d, r)
    given = given_args(hf, given)
    schema = [a.name for a in kind.schema]
    huge = _given_within_limits(d, kind, given, r)
    problems = call_kind(r, d.kind.loc, kind, kind.check_args, given)
    if problems is None:
        return None
    for arg, message in problems:
        if arg is not None and arg not in schema:
            message += did_you_mean(arg, schema)
        at = next((s.loc for s in d.args if s.key.name == arg), (d.source or d.kind).loc)
        r.error(message, at)
    binding_ok = _check_binding_name(d, r, modality_names)
    if problems or not ok or huge:
        return None
    args = call_kind(r, d.kind.loc, kind, kind.resolve, given)
    if args is None or not _defaults_within_limits(d, kind, given, args, r):
        return None
    widths = call_kind(r, d.kind.loc, kind, lambda a: (kind.in_width(a), kind.out_width(a)), args)
    if widths is None:
        return None
    if binding_ok and d.modality is not None and d.modality.name in modalities:
        reason = call_kind(
            r, d.modality.loc, kind, modality_problem, kind, args, modalities[d.modality.name]
        )
        if reason:
            r.error(reason, d.modality.loc)
            return None
    if not binding_ok:
        return None
    return ResolvedModule(
        name=name,
        keyword=d.keyword,
        kind=kind.name,
        args=tuple(sorted(args.items())),
        frozen=d.frozen,
        modality=d.modality.name if d.modality is not None else None,
        in_width=int(widths[0]),
        out_width=int(widths[1]),
        loc=d.name.loc,
        hf=hf.model.folder if hf is not None else None,
    )


def _given_within_limits(d: ModuleDecl, kind: Kind, given: dict[str, Any], r: Reporter) -> bool:
    """Report given numeric arguments above ``limits``' bound for their name and type (the
    kind checks names, types and its own minimums); True if any was reported."""
    specs = {a.name: a for a in kind.schema}
    huge = False
    for s in d.args:
        name, value = s.key.name, s.value.value
        spec = specs.get(name)
        limit = limits.arg_limit(name, value)
        if spec is None or limit is None or given.get(name) is not value:
            continue
        if spec.type is int and not isinstance(value, int):
            continue  # wrong type: the kind says so
        huge = not r.within(value, f"'{name}' of {kind.name}()", limit, s.loc, lower=False) or huge
    return huge


def _defaults_within_limits(
    d: ModuleDecl, kind: Kind, given: dict[str, Any], args: dict[str, Any], r: Reporter
) -> bool:
    """Defaults the kind computed (``ffn = 4 * hidden``) within their bounds, reported at the
    kind's name; True when all are."""
    ok = True
    for name, value in args.items():
        limit = limits.arg_limit(name, value)
        if name not in given and limit is not None:
            what = f"'{name}' of {kind.name}() (its default)"
            ok = r.within(value, what, limit, d.kind.loc, lower=False) and ok
    return ok


def _given_args(d: ModuleDecl, r: Reporter) -> tuple[dict[str, Any], bool]:
    """The arguments as written (the first of a repeated one); ``ok`` is False after an
    error here: a repeated argument, or a size with a unit."""
    given: dict[str, Any] = {}
    ok = True
    for s in d.args:
        key = s.key.name
        if key in given:
            r.error(f"argument '{key}' is given twice", s.key.loc)
            ok = False
            continue
        if s.value.kind == "size":
            r.error(
                f"'{key}' takes a plain number; units such as {s.value.unit} belong in the "
                "cluster block",
                s.value.loc,
            )
            ok = False
        # The number goes on to the kind even after a unit error, so that the kind does not
        # also complain that the argument is missing.
        given[key] = s.value.value
    return given, ok


def _check_binding_name(d: ModuleDecl, r: Reporter, modality_names: set[str]) -> bool:
    """``<- MODALITY``: required on an encoder, refused on a plain module, must name one."""
    name = d.name.name
    if d.modality is None:
        if d.keyword == "encoder":
            r.error(
                f"encoder '{name}' needs the modality it reads",
                d.name.loc,
                hint=f"write 'encoder {name} : {d.kind.name}(...) <- MODALITY'",
            )
            return False
        return True
    if d.keyword == "module":
        r.error(
            f"a plain module reads no modality; declare '{name}' as an encoder to bind it to "
            f"'{d.modality.name}'",
            d.modality.loc,
        )
        return False
    if d.modality.name not in modality_names:
        r.error(
            f"unknown modality '{d.modality.name}'{did_you_mean(d.modality.name, modality_names)}",
            d.modality.loc,
        )
        return False
    return True


def check_tied_embeddings(
    modules: dict[str, ResolvedModule],
    reads: dict[str, set[str]],
    modalities: dict[str, ModalityInfo],
    r: Reporter,
) -> None:
    """A module whose head is tied to its token embedding must read exactly one vocab
    modality raw (``reads``: module -> modalities any task feeds it raw): that modality's
    input stage holds the one matrix the embedding and the head share."""
    for name, m in modules.items():
        kind = get_kind(m.kind)
        if not call_kind(r, m.loc, kind, kind.tied_embeddings, m.argmap):
            continue
        vocab = sorted(x for x in reads.get(name, ()) if modalities[x].vocab is not None)
        if len(vocab) != 1:
            found = "none" if not vocab else ", ".join(vocab)
            r.error(
                f"module '{name}' ties its LM head to its token embedding, so it must read "
                f"exactly one token-id modality; it reads {found}",
                m.loc,
                hint="route one vocab modality into it (text -> " + name + "), or set "
                "tie_embeddings = false",
            )
