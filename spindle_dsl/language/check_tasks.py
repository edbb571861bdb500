"""Task blocks: paths to edges, names, token counts, cycles, widths, inputs, sinks and losses.

Each task's graph is built edge by edge in declaration order. An edge that would close a
cycle is reported where it is written and left out, so the rest of the task is still checked
against an acyclic graph. Checks that only make sense on a whole graph (every module has an
input, the loss fits the sinks) run only on tasks whose names and modules all resolved: on a
graph with a hole in it they would report the hole again under another name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from spindle_dsl.kinds import get_kind
from spindle_dsl.language import limits
from spindle_dsl.language.ast import Ident, Loc, Path, Setting, TaskDecl
from spindle_dsl.language.check_modules import modality_problem
from spindle_dsl.language.files import is_reference, spec_relative
from spindle_dsl.language.reporter import Reporter
from spindle_dsl.language.resolved import Edge, ResolvedModule
from spindle_dsl.language.suggest import did_you_mean
from spindle_dsl.metagraph import Loss, ModalityInfo

TASK_KEYS = ("batch", "loss", "data", "eval_data")
LOSSES: tuple[Loss, ...] = ("lm", "contrastive", "mse")


@dataclass(frozen=True)
class Names:
    """Everything a task may refer to: declared names, and those whose declaration is valid."""

    modality_names: frozenset[str]
    module_names: frozenset[str]
    task_names: frozenset[str]
    modalities: dict[str, ModalityInfo]
    modules: dict[str, ResolvedModule]


@dataclass
class TaskDraft:
    """A task as far as it could be resolved; ``sound`` when its graph has no holes."""

    decl: TaskDecl
    modules: list[str] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    sinks: list[str] = field(default_factory=list)
    sound: bool = True
    batch: int | None = None
    batch_setting: Setting | None = None
    loss: Loss | None = None
    loss_setting: Setting | None = None
    data: str | None = None  # resolved path or package.module:function
    eval_data: str | None = None  # held-out data, as ``data``
    refs: dict[str, list[Loc]] = field(default_factory=dict)  # every reference to a node

    @property
    def name(self) -> str:
        return self.decl.name.name


class TaskChecker:
    """Checks every task; ``seen_pairs`` makes an edge problem shared by tasks one error."""

    def __init__(self, r: Reporter, names: Names):
        self.r = r
        self.n = names
        self.seen_pairs: set[tuple[str, str]] = set()
        self.unknown_names = False

    def check(self, decl: TaskDecl) -> TaskDraft:
        t = TaskDraft(decl)
        self._settings(t)
        if not decl.paths:
            self.r.error(
                f"task '{t.name}' has no path",
                decl.name.loc,
                hint="add one, such as 'text -> lm'",
            )
            t.sound = False
        counts: dict[str, tuple[int, Loc]] = {}
        raw: list[tuple[Ident, Ident]] = []
        for path in decl.paths:
            raw.extend(self._path(t, path, counts))
        self._build_edges(t, raw, counts)
        if t.sound:
            self._inputs(t)
        out_of = {e.source for e in t.edges}
        t.sinks = [m for m in t.modules if m not in out_of]
        if t.sound and all(m in self.n.modules for m in t.modules):
            self._loss(t)
        return t

    # --- settings ---------------------------------------------------------------------------
    def _settings(self, t: TaskDraft) -> None:
        seen: set[str] = set()
        for s in t.decl.settings:
            key = s.key.name
            if key not in TASK_KEYS:
                self.r.error(
                    f"unknown task setting '{key}'{did_you_mean(key, TASK_KEYS)}",
                    s.key.loc,
                    hint="a task takes paths (a -> b), batch = N, loss = lm|contrastive|mse, "
                    'data = "folder" and eval_data = "folder"',
                )
            elif key in seen:
                self.r.error(f"'{key}' is set twice in task '{t.name}'", s.key.loc)
            elif key == "batch":
                seen.add(key)
                t.batch_setting = s
                t.batch = self.r.integer(
                    s.value, f"batch of task '{t.name}'", at=s.loc, limit=limits.BATCH
                )
            elif key == "data":
                seen.add(key)
                t.data = self._data(t, s)
            elif key == "eval_data":
                seen.add(key)
                t.eval_data = self._data(t, s)
            else:
                seen.add(key)
                t.loss_setting = s
                word = self.r.word(s.value, "loss")
                if word is not None and word not in LOSSES:
                    self.r.error(
                        f"unknown loss '{word}'{did_you_mean(word, LOSSES)}",
                        s.value.loc,
                        hint="losses: " + ", ".join(LOSSES),
                    )
                elif word is not None:
                    t.loss = word  # type: ignore[assignment]

    def _data(self, t: TaskDraft, s: Setting) -> str | None:
        """``data = "folder"`` (relative to the spec; it must exist) or a
        ``"package.module:function"`` that returns a dataset (imported when training);
        ``eval_data`` the same, for held-out data."""
        what = s.key.name
        if s.value.kind != "string":
            self.r.error(
                f"{what} of task '{t.name}' is a quoted path or \"package.module:function\", "
                f"got {s.value.describe()}",
                s.value.loc,
            )
            return None
        text = str(s.value.value)
        if is_reference(text):
            return text
        path = spec_relative(self.r.path, text)
        if not os.path.exists(path):
            self.r.error(
                f"{what} of task '{t.name}': {s.value.describe()} not found (looked for {path})",
                s.value.loc,
                hint="a folder with one .npy array per modality (spindle data synth writes "
                'one), or "package.module:function" returning a dataset',
            )
            return None
        return path

    # --- paths ------------------------------------------------------------------------------
    def _path(
        self, t: TaskDraft, path: Path, counts: dict[str, tuple[int, Loc]]
    ) -> list[tuple[Ident, Ident]]:
        """Resolve a path's names; the pairs of consecutive resolved steps become edges."""
        ok: list[bool] = []
        for i, step in enumerate(path.steps):
            ok.append(self._step(t, step, i))
            t.refs.setdefault(step.name, []).append(step.loc)
            if ok[-1] and step.name in self.n.module_names and step.name not in t.modules:
                t.modules.append(step.name)
        head = path.steps[0]
        if path.first_tokens is not None and ok[0]:
            if head.name not in self.n.modality_names:
                self.r.error(
                    f"a token count applies to a modality; '{head.name}' is a module",
                    path.first_tokens.loc,
                )
            else:
                n = self.r.integer(
                    path.first_tokens, f"token count of '{head.name}'", limit=limits.TOKENS
                )
                if n is not None:
                    earlier = counts.setdefault(head.name, (n, path.first_tokens.loc))
                    if earlier[0] != n:
                        self.r.error(
                            f"task '{t.name}' gives '{head.name}' {n} tokens here but "
                            f"{earlier[0]} on line {earlier[1].line}",
                            path.first_tokens.loc,
                            hint="a modality has one token count per task",
                        )
        return [
            (a, b)
            for (a, b), ok_a, ok_b in zip(path.edges(), ok, ok[1:], strict=False)
            if ok_a and ok_b
        ]

    def _step(self, t: TaskDraft, step: Ident, index: int) -> bool:
        name = step.name
        if name in self.n.module_names:
            return True
        if name in self.n.modality_names:
            if index == 0:
                return True
            self.r.error(
                f"modality '{name}' can only start a path: it reads nothing",
                step.loc,
                hint=f"start a new path: '{name} -> ...'",
            )
        elif name in self.n.task_names:
            self.r.error(f"'{name}' is a task; a path joins modalities and modules", step.loc)
        else:
            pool = sorted(self.n.module_names | (self.n.modality_names if index == 0 else set()))
            what = "module or modality" if index == 0 else "module"
            self.r.error(f"unknown {what} '{name}'{did_you_mean(name, pool)}", step.loc)
            self.unknown_names = True
        t.sound = False
        return False

    # --- edges ------------------------------------------------------------------------------
    def _build_edges(
        self, t: TaskDraft, raw: list[tuple[Ident, Ident]], counts: dict[str, tuple[int, Loc]]
    ) -> None:
        succ: dict[str, set[str]] = {}
        seen: set[tuple[str, str]] = set()
        for a, b in raw:
            pair = (a.name, b.name)
            if pair in seen:
                continue  # a path may repeat an edge another path wrote; the graph is a set
            loc = a.loc.to(b.loc) if a.loc.line == b.loc.line else b.loc
            cycle = _path_between(succ, b.name, a.name)
            if cycle is not None:
                shown = " -> ".join([*cycle, b.name])
                self.r.error(
                    f"edge '{a.name} -> {b.name}' closes a cycle in task '{t.name}': {shown}",
                    loc,
                    hint="a task's graph must be acyclic; remove or reverse one edge",
                )
                t.sound = False
                continue
            seen.add(pair)
            succ.setdefault(a.name, set()).add(b.name)
            from_modality = a.name in self.n.modality_names
            tokens = None
            if from_modality:
                info = self.n.modalities.get(a.name)
                tokens = counts[a.name][0] if a.name in counts else (info.tokens if info else None)
            t.edges.append(Edge(a.name, b.name, from_modality, tokens, loc))
            self._edge_fits(a.name, b.name, from_modality, loc)

    def _edge_fits(self, src: str, dst: str, from_modality: bool, loc: Loc) -> None:
        """Widths on module edges; modality bindings and readability on modality edges."""
        target = self.n.modules.get(dst)
        if target is None or (src, dst) in self.seen_pairs:
            return
        if from_modality:
            info = self.n.modalities.get(src)
            if info is None:
                return
            self.seen_pairs.add((src, dst))
            if target.modality is not None and target.modality != src:
                self.r.error(
                    f"{target.keyword} '{dst}' reads modality '{target.modality}', not '{src}'",
                    loc,
                )
                return
            if target.modality is None:
                kind = get_kind(target.kind)
                try:
                    reason = modality_problem(kind, target.argmap, info)
                except Exception as exc:  # a user kind's bug becomes an error, not a traceback
                    reason = f"kind '{kind.name}' failed: {type(exc).__name__}: {exc}"
                if reason:
                    self.r.error(reason, loc)
            return
        source = self.n.modules.get(src)
        if source is None:
            return
        self.seen_pairs.add((src, dst))
        if source.out_width != target.in_width:
            self.r.error(
                f"width mismatch on edge '{src} -> {dst}': '{src}' emits {source.out_width}-wide "
                f"tokens but '{dst}' reads {target.in_width}-wide tokens",
                loc,
                hint="make the widths agree, or put a projection such as "
                f"mlp(in = {source.out_width}, out = {target.in_width}) between them",
            )

    def _inputs(self, t: TaskDraft) -> None:
        fed = {e.target for e in t.edges}
        for m in t.modules:
            if m in fed:
                continue
            module = self.n.modules.get(m)
            bound = module.modality if module is not None else None
            hint = f"write '{bound} -> {m}'" if bound else "give it an input: 'x -> " + m + "'"
            self.r.error(f"module '{m}' has no input in task '{t.name}'", t.refs[m][0], hint=hint)
            t.sound = False

    # --- loss -------------------------------------------------------------------------------
    def _loss(self, t: TaskDraft) -> None:
        setting = t.loss_setting
        sinks = [self.n.modules[m] for m in t.sinks]
        if t.loss is None and setting is not None:
            return  # the loss setting itself was wrong, and reported
        loss = t.loss or self._default_loss(t, sinks)
        if loss is None:
            return
        t.loss = loss
        where = setting.loc if setting is not None else t.refs[t.sinks[-1]][-1]
        names = ", ".join(f"'{m.name}'" for m in sinks)
        if loss == "lm":
            if len(sinks) != 1:
                self.r.error(f"loss lm reads one sink, but task '{t.name}' has {names}", where)
            elif not _has_lm_head(sinks[0]):
                self.r.error(
                    f"loss lm needs a causal model with a vocab as the sink; '{sinks[0].name}' "
                    "has no LM head",
                    where,
                    hint="give it causal = true and vocab = N, or choose another loss",
                )
            elif not self._reads_vocab(t, sinks[0].name):
                self.r.error(
                    f"loss lm predicts the next text token, but no modality with a vocab feeds "
                    f"'{sinks[0].name}' in task '{t.name}'",
                    where,
                    hint=f"add a path such as 'text -> {sinks[0].name}'",
                )
        elif loss == "contrastive":
            if len(sinks) != 2:
                self.r.error(
                    f"loss contrastive compares two sinks, but task '{t.name}' has "
                    f"{len(sinks)} ({names})",
                    where,
                )
            elif sinks[0].out_width != sinks[1].out_width:
                a, b = sinks
                self.r.error(
                    f"loss contrastive needs sinks of equal width: '{a.name}' emits "
                    f"{a.out_width}, '{b.name}' emits {b.out_width}",
                    where,
                )

    def _default_loss(self, t: TaskDraft, sinks: list[ResolvedModule]) -> Loss | None:
        if len(sinks) == 1 and _has_lm_head(sinks[0]):
            return "lm"
        if len(sinks) == 2 and sinks[0].out_width == sinks[1].out_width:
            return "contrastive"
        names = ", ".join(f"'{m.name}'" for m in sinks)
        self.r.error(
            f"task '{t.name}' must say its loss: its sinks ({names}) are neither one causal "
            "model with a vocab (lm) nor two of equal width (contrastive)",
            t.decl.name.loc,
            hint="add 'loss = lm', 'loss = contrastive' or 'loss = mse'",
        )
        return None

    def _reads_vocab(self, t: TaskDraft, module: str) -> bool:
        for e in t.edges:
            info = self.n.modalities.get(e.source)
            if e.target == module and info is not None and info.vocab is not None:
                return True
        return False


def _has_lm_head(m: ResolvedModule) -> bool:
    args = m.argmap
    return args.get("causal") is True and args.get("vocab") is not None


def _path_between(succ: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A path start -> ... -> goal along ``succ`` (depth first), or None."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    visited: set[str] = set()
    while stack:
        node, trail = stack.pop()
        if node == goal:
            return trail
        if node in visited:
            continue
        visited.add(node)
        for nxt in sorted(succ.get(node, ())):
            stack.append((nxt, [*trail, nxt]))
    return None
