"""Hugging Face folders in a spec: ``hf("DIR")`` modules and ``from "DIR"`` weights.

``hf("DIR", ...)`` takes its kind and arguments from ``DIR/config.json`` (``spindle_dsl.hf``);
the spec may add the arguments the config does not hold (``output``, ``out_tokens``, a
structural default such as a ViT's ``pool``) and may repeat one it does, but an argument that
disagrees with the config is an error at that argument, naming the config field and its value.
A config the project cannot honour is an error at the folder string. ``from "DIR"`` on a module
declared with its own arguments loads that folder's weights once its config agrees with them.

After the tasks are checked, the data is held to what the configs fix: a token-id modality's
vocabulary, an image modality's patches (image size and patch), Whisper's mel bins, and a
sliding attention window no sequence may outgrow; each disagreement is an error at the
modality (or the folder string, for the window) naming both values. The same pass enforces
a rule of every kind whose input stage adds or merges tokens (a CLS token, a strided stem):
such a module reads exactly one raw modality and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spindle_dsl.hf.config import HfModel, resolve
from spindle_dsl.hf.files import has_weights, pickled_only
from spindle_dsl.hf.mapping import HfError
from spindle_dsl.kinds import get_kind
from spindle_dsl.language.ast import Loc, ModalityDecl, ModuleDecl
from spindle_dsl.language.files import spec_relative
from spindle_dsl.language.reporter import Reporter
from spindle_dsl.language.resolved import Edge, ResolvedModule
from spindle_dsl.metagraph import ModalityInfo

_FORM_KIND = {"image": "vit", "vocab": "transformer", "features": "transformer"}


@dataclass(frozen=True)
class HfDecl:
    """An ``hf("DIR")`` declaration resolved: the model, and the config's arguments that
    the spec does not give itself."""

    model: HfModel
    given: dict[str, Any]


def _form(info: ModalityInfo) -> str:
    if info.vocab is not None:
        return "vocab"
    return "features" if info.features is not None else "image"


def hf_kind(d: ModuleDecl, r: Reporter, modalities: Mapping[str, ModalityInfo]) -> HfDecl | None:
    """The model behind ``hf("DIR")``, or None after reporting why not."""
    if d.kind.name != "hf":
        assert d.source is not None
        r.error(
            f'{d.kind.name}() takes no folder string; only hf("DIR") reads one',
            d.source.loc,
            hint=f'write {d.kind.name}(NAME = VALUE, ...), or hf("DIR") for a Hugging Face folder',
        )
        return None
    if d.source is None or not isinstance(d.source.value, str):
        r.error('hf() needs the folder of a Hugging Face model: hf("models/NAME")', d.kind.loc)
        return None
    folder = spec_relative(r.path, d.source.value)
    settings = {s.key.name: s for s in d.args}
    tower = settings.get("tower")
    bound = modalities.get(d.modality.name) if d.modality is not None else None
    try:
        model = resolve(
            folder,
            tower=str(tower.value.value) if tower is not None else None,
            hint=_FORM_KIND[_form(bound)] if bound is not None else None,
        )
    except HfError as exc:
        r.error(f"hf({d.source.describe()}): {exc}", d.source.loc, hint=_hint(exc))
        return None
    except (TypeError, ValueError, KeyError, ArithmeticError) as exc:  # a malformed config
        r.error(f"hf({d.source.describe()}): config.json cannot be read: {exc!r}", d.source.loc)
        return None
    ok = True
    for key, s in settings.items():
        if key == "tower" or key not in model.args or key in model.family.defaults:
            continue
        if not _same(s.value.value, model.args[key]):
            r.error(
                f"'{key} = {s.value.describe()}' disagrees with {d.source.describe()}: "
                f"{model.describe(key)}",
                s.loc,
                hint="drop it: hf() takes it from the config",
            )
            ok = False
    if not ok:
        return None
    given = {k: v for k, v in model.args.items() if k not in settings}
    return HfDecl(model, given)


def _hint(exc: HfError) -> str | None:
    if exc.field == "model_type":
        return "the supported architectures are listed in docs/hf.md"
    if exc.field is not None:
        return f"the project cannot honour {exc.field}; see docs/hf.md"
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return a == b


def given_args(hf: HfDecl | None, given: dict[str, Any]) -> dict[str, Any]:
    """The arguments a kind gets: the config's, then the spec's (``tower`` is hf()'s own)."""
    if hf is None:
        return given
    return {**hf.given, **{k: v for k, v in given.items() if k != "tower"}}


def folder_weights(
    d: ModuleDecl, resolved: ResolvedModule, weights: str | None, r: Reporter
) -> tuple[str | None, str | None] | None:
    """(what to load, the Hugging Face folder the module follows) of a module, or None after
    an error: an hf() folder's own weights unless ``from`` names others (a folder without
    weights: the seeded start, with a warning); a ``from`` folder once its config agrees."""
    if resolved.hf is not None:
        folder = resolved.hf
        if weights is not None:
            return weights, folder
        if has_weights(folder):
            return folder, folder
        assert d.source is not None
        why = (
            "holds weights only as pytorch_model.bin"
            if pickled_only(folder)
            else "holds no weights"
        )
        r.warning(
            f"{d.source.describe()} {why} (model.safetensors): module '{d.name.name}' starts "
            f"from its seeded initialisation",
            d.source.loc,
        )
        return None, folder
    if weights is None or not os.path.isdir(weights):
        return weights, None
    assert d.weights is not None
    try:
        model = resolve(weights, kind=resolved.kind)
    except HfError as exc:
        r.error(f"from {d.weights.describe()}: {exc}", d.weights.loc, hint=_hint(exc))
        return None
    except (TypeError, ValueError, KeyError, ArithmeticError) as exc:  # a malformed config
        r.error(f"from {d.weights.describe()}: config.json cannot be read: {exc!r}", d.weights.loc)
        return None
    kind = get_kind(resolved.kind)
    expected = kind.resolve(model.args)
    mine = resolved.argmap
    wrong = [
        f"{a} = {mine.get(a)!r} here, but {model.describe(a)}"
        for a in model.family.table.args
        if not _same(mine.get(a), expected.get(a))
    ]
    if wrong:
        r.error(
            f"module '{d.name.name}' does not match {d.weights.describe()}: " + "; ".join(wrong),
            d.weights.loc,
            hint=f"or declare it as hf({d.weights.describe()}) to take the config as it is",
        )
        return None
    if not has_weights(weights):
        r.error(f"{d.weights.describe()} holds no model.safetensors", d.weights.loc)
        return None
    return weights, weights


# --- after the tasks: the data against the configs ---------------------------------------------


@dataclass(frozen=True)
class DataContext:
    """What the data checks read: resolved modules and modalities, the declarations (for
    locations) and every task's edges."""

    modules: Mapping[str, ResolvedModule]
    modalities: Mapping[str, ModalityInfo]
    modality_decls: Mapping[str, ModalityDecl]
    module_decls: Mapping[str, ModuleDecl]
    tasks: tuple[tuple[str, tuple[Edge, ...]], ...]


def check_data(ctx: DataContext, r: Reporter) -> None:
    """Every check of the module docstring's second paragraph."""
    for name, m in ctx.modules.items():
        edges = [e for _, es in ctx.tasks for e in es if e.target == name]
        _check_stage_tokens(ctx, name, m, edges, r)
        if m.hf is None:
            continue
        try:
            model = resolve(m.hf, kind=m.kind)
        except HfError:
            continue  # reported where the module was declared
        for source in sorted({e.source for e in edges if e.from_modality}):
            if source in ctx.modalities:
                _check_modality(ctx, model, ctx.modalities[source], r)
        _check_window(ctx, name, model, r)


def _check_stage_tokens(
    ctx: DataContext, name: str, m: ResolvedModule, edges: list[Edge], r: Reporter
) -> None:
    kind, args = get_kind(m.kind), m.argmap
    if all(kind.layer_tokens(args, t) == t for t in (1, 1000)):
        return
    sources = sorted({(e.source, e.from_modality) for e in edges})
    if len(sources) > 1 or any(not raw for _, raw in sources):
        listed = ", ".join(s for s, _ in sources)
        r.error(
            f"module '{name}' adds or merges tokens in its input stage (a CLS token, a strided "
            f"stem), so it must read exactly one raw modality; it reads {listed}",
            m.loc,
        )


def _setting_loc(ctx: DataContext, modality: str, key: str) -> Loc | None:
    decl = ctx.modality_decls.get(modality)
    if decl is None:
        return None
    at = next((s.loc for s in decl.settings if s.key.name == key), None)
    return at or decl.name.loc


def _check_modality(ctx: DataContext, model: HfModel, info: ModalityInfo, r: Reporter) -> None:
    lim, where = model.limits, os.path.join(model.folder, "config.json")
    form = _form(info)
    if form == "vocab" and lim.vocab is not None and info.vocab != lim.vocab:
        r.error(
            f"modality '{info.name}' has vocab = {info.vocab}, but {where} has vocab_size = "
            f"{lim.vocab}",
            _setting_loc(ctx, info.name, "vocab"),
            hint=f"set vocab = {lim.vocab} (the model's tokenizer)",
        )
    if form == "image" and lim.image_size is not None and lim.patch:
        side = lim.image_size if isinstance(lim.image_size, int) else None
        if side is None:
            r.error(f"image_size = {lim.image_size} in {where}: only square images are read")
            return
        patches = (side // lim.patch) ** 2
        if info.tokens != patches:
            r.error(
                f"modality '{info.name}' has tokens = {info.tokens}, but {where} has "
                f"image_size = {side} and patch_size = {lim.patch}: {patches} patches",
                _setting_loc(ctx, info.name, "tokens"),
                hint=f"set tokens = {patches}",
            )
    if form == "features" and lim.features is not None and info.features != lim.features:
        r.error(
            f"modality '{info.name}' has features = {info.features}, but {where} has "
            f"num_mel_bins = {lim.features}",
            _setting_loc(ctx, info.name, "features"),
        )
    if form == "features" and lim.frames is not None and info.tokens > lim.frames:
        r.error(
            f"modality '{info.name}' has tokens = {info.tokens} frames, but {where} has "
            f"max_source_positions = {lim.frames // 2}: at most {lim.frames} frames",
            _setting_loc(ctx, info.name, "tokens"),
        )


def _check_window(ctx: DataContext, name: str, model: HfModel, r: Reporter) -> None:
    if model.limits.window is None:
        return
    window, text = model.limits.window
    for task, edges in ctx.tasks:
        tokens = _tokens_into(ctx, name, edges, {})
        if tokens is not None and tokens > window:
            d = ctx.module_decls[name]
            at = d.source or d.weights
            r.error(
                f"{text} in {os.path.join(model.folder, 'config.json')} is shorter than the "
                f"{tokens} tokens task '{task}' feeds module '{name}', and the project's "
                f"attention is not windowed",
                at.loc if at is not None else d.kind.loc,
                hint=f"feed at most {window} tokens per sample",
            )
            return


def _tokens_into(
    ctx: DataContext, name: str, edges: tuple[Edge, ...], memo: dict[str, int | None]
) -> int | None:
    """Tokens per sample a task feeds module ``name`` (None: unknown, e.g. a bad module)."""
    if name in memo:
        return memo[name]
    memo[name] = None  # a cycle (reported by the task checks) stays unknown
    total = 0
    for e in edges:
        if e.target != name:
            continue
        if e.from_modality:
            if e.tokens is None:
                return None
            total += e.tokens
            continue
        source = ctx.modules.get(e.source)
        before = _tokens_into(ctx, e.source, edges, memo)
        if source is None or before is None:
            return None
        total += get_kind(source.kind).out_tokens(source.argmap, before)
    memo[name] = total
    return total
