"""Where each comment of a file belongs, so that ``spindle fmt`` can put it back.

A formatter that drops comments is unusable, and one that moves them to the wrong node is
worse. Each comment is attached to what it sits beside in the source:

* after a node on the line where that node ends: a *trailing* comment of the innermost such
  node (a statement, a kind argument, or the whole declaration after its ``}`` or ``)``);
* after the ``{`` or ``(`` that opens a multi-line body: a *header* comment of the declaration;
* on a line of its own: a *standalone* comment of the body it lies in (or of the file), kept
  in line order among that body's statements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spindle_dsl.language.ast import (
    ClusterDecl,
    Comment,
    Decl,
    MixDecl,
    ModalityDecl,
    ModuleDecl,
    Path,
    ScheduleDecl,
    ScheduleEntry,
    Setting,
    Spec,
    TaskDecl,
    TrainDecl,
    Value,
)

Child = Path | Setting | ScheduleEntry | Value


@dataclass
class Attached:
    """Comments keyed by the ``id`` of the node they belong to (None: the file itself)."""

    trailing: dict[int, str] = field(default_factory=dict)
    header: dict[int, str] = field(default_factory=dict)
    standalone: dict[int | None, list[Comment]] = field(default_factory=dict)

    def inside(self, node: object) -> bool:
        """Whether a declaration has comments that only a multi-line layout can keep."""
        return (
            id(node) in self.header
            or bool(self.standalone.get(id(node)))
            or any(id(c) in self.trailing for c in children(node))
        )


def children(decl: object) -> tuple[Child, ...]:
    """The statements of a block, or the arguments of a module declaration."""
    if isinstance(decl, ClusterDecl | ModalityDecl | MixDecl | TrainDecl):
        return decl.settings
    if isinstance(decl, TaskDecl):
        return decl.body
    if isinstance(decl, ScheduleDecl):
        return decl.entries
    if isinstance(decl, ModuleDecl):  # the folder string of hf("DIR") first, then the settings
        return decl.args if decl.source is None else (decl.source, *decl.args)
    return ()


def header_line(decl: Decl) -> int:
    """The line of the opening ``{`` (or a module's ``(``, which follows its kind)."""
    return decl.kind.loc.line if isinstance(decl, ModuleDecl) else decl.loc.line


def attach(spec: Spec) -> Attached:
    out = Attached()
    for c in spec.comments:
        owner = _owner(spec.decls, c)
        if owner is None:
            out.standalone.setdefault(None, []).append(c)
            continue
        loc = owner.loc
        if c.line == loc.end_line and c.column >= loc.end_column:
            out.trailing[id(owner)] = c.text
            continue
        ending_here = [
            ch
            for ch in children(owner)
            if ch.loc.end_line == c.line and ch.loc.end_column <= c.column
        ]
        if ending_here:
            out.trailing[id(ending_here[-1])] = c.text
        elif c.line == header_line(owner):
            out.header[id(owner)] = c.text
        else:
            out.standalone.setdefault(id(owner), []).append(c)
    return out


def _owner(decls: tuple[Decl, ...], c: Comment) -> Decl | None:
    """The last declaration whose lines hold the comment and that starts before it."""
    found = None
    for d in decls:
        starts_before = d.loc.line < c.line or (d.loc.line == c.line and d.loc.column < c.column)
        if starts_before and c.line <= d.loc.end_line:
            found = d
    return found
