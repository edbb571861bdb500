"""``spindle fmt``: one canonical layout for every spec, like black or terraform fmt.

The layout never changes meaning (``parse(format_spec(s)) == s``) and is a fixed point
(formatting twice changes nothing). It keeps what the author chose where the choice carries
information, and decides everything else:

* kept: the order of declarations and statements, every comment, a blank line where the
  source had one or more, and a one-line block (``modality text { tokens = 77 }``) that fits
  in 100 columns;
* decided: two-space indentation, one statement per line in multi-line blocks, ``key = value``
  and ``a -> b`` spacing, ``=`` aligned in runs of settings, keyword, name and ``{`` aligned in
  runs of one-line declarations, trailing comments aligned in runs, and a module declaration
  longer than 100 columns broken into one argument per line.
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence

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
from spindle_dsl.language.fmt_comments import Attached, attach, children

INDENT = "  "
LINE_LENGTH = 100
Line = tuple[str, str | None] | None  # (code, trailing comment); None is a blank line
_ESCAPE = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}


def format_spec(spec: Spec) -> str:
    """The canonical text of ``spec`` (which must carry its comments, as ``parse`` gives)."""
    att = attach(spec)
    lines = _body(list(spec.decls), att.standalone.get(None, []), att, top=True)
    return _join(lines)


# --- values and small pieces ------------------------------------------------------------------
def value_text(v: Value) -> str:
    if v.kind == "bool":
        return "true" if v.value else "false"
    if v.kind == "string":
        return '"' + "".join(_ESCAPE.get(ch, ch) for ch in str(v.value)) + '"'
    if v.kind in ("int", "float"):
        return _number(v.value)  # type: ignore[arg-type]
    if v.kind == "size":
        return _number(v.value, positional=True) + str(v.unit)  # type: ignore[arg-type]
    return str(v.value)


def _number(x: int | float, positional: bool = False) -> str:
    """Shortest text that reads back as the same number (sizes take no exponent)."""
    if isinstance(x, int):
        return str(x)
    text = repr(x)
    if positional and "e" in text:
        text = f"{decimal.Decimal(text):f}"
        text = text if "." in text else text + ".0"
    return text


def _setting(s: Setting, key_width: int = 0) -> str:
    return f"{s.key.name.ljust(key_width)} = {value_text(s.value)}"


def _path(p: Path) -> str:
    head = p.steps[0].name
    if p.first_tokens is not None:
        head += f"[{value_text(p.first_tokens)}]"
    return " -> ".join([head, *(s.name for s in p.steps[1:])])


def _statement(node: Path | Setting | ScheduleEntry, key_width: int = 0) -> str:
    if isinstance(node, ScheduleEntry):
        return f"{value_text(node.step)}: {node.mix.name}"
    return _path(node) if isinstance(node, Path) else _setting(node, key_width)


# --- bodies: a sequence of nodes and standalone comments --------------------------------------
def _span(node: object) -> tuple[int, int]:
    if isinstance(node, Comment):
        return node.line, node.line
    loc = node.loc  # type: ignore[attr-defined]
    return loc.line, loc.end_line


def _body(nodes: Sequence, comments: list[Comment], att: Attached, *, top: bool) -> list[Line]:
    """Render nodes and comments in source order, keeping single blank lines between them."""
    items = sorted(
        [*nodes, *comments],
        key=lambda n: (_span(n)[0], n.column if isinstance(n, Comment) else n.loc.column),
    )
    rendered = [_render_item(n, att, top) for n in items]
    _align(items, rendered, att, top)
    out: list[Line] = []
    prev_end: int | None = None
    for node, lines in zip(items, rendered, strict=True):
        start, end = _span(node)
        if prev_end is not None and start > prev_end + 1:
            out.append(None)
        out.extend(lines)
        prev_end = end
    return out


def _render_item(node: object, att: Attached, top: bool, **pad: int) -> list[Line]:
    if isinstance(node, Comment):
        return [(node.text, None)]
    if not top:
        return [(_statement(node, pad.get("key", 0)), att.trailing.get(id(node)))]  # type: ignore[arg-type]
    if isinstance(node, ModuleDecl):
        return _module(node, att, **pad)
    return _block(node, att, **pad)  # type: ignore[arg-type]


def _align(items: list, rendered: list[list[Line]], att: Attached, top: bool) -> None:
    """Re-render runs of adjacent one-line items of one sort with their columns aligned.

    A run ends at a blank line or at an item of another sort (a multi-line one included);
    comment lines inside it are transparent, as gofmt treats them.
    """
    run: list[int] = []

    def sort_of(i: int) -> str | None:
        node = items[i]
        if isinstance(node, Comment) or len(rendered[i]) != 1:
            return None
        if not top:
            return "setting" if isinstance(node, Setting) else None
        return type(node).__name__

    def flush() -> None:
        if len(run) > 1:
            nodes = [items[i] for i in run]
            if not top:
                pad = {"key": max(len(n.key.name) for n in nodes)}
            elif isinstance(nodes[0], ModuleDecl):
                pad = {
                    "keyword": max(len(n.keyword) for n in nodes),
                    "name": max(len(n.name.name) for n in nodes),
                }
            else:
                pad = {"name": max(len(n.name.name) for n in nodes)}
            for i in run:
                rendered[i] = _render_item(items[i], att, top, **pad)
        run.clear()

    prev: int | None = None
    for i, node in enumerate(items):
        adjacent = prev is not None and _span(node)[0] <= _span(items[prev])[1] + 1
        if not adjacent:
            flush()  # a blank line ends a run
        prev = i
        if isinstance(node, Comment):
            continue  # a comment line between two aligned lines does not end their run
        sort = sort_of(i)
        if sort is None or (run and sort_of(run[-1]) != sort):
            flush()
        if sort is not None and not isinstance(node, ClusterDecl | ScheduleDecl | TrainDecl):
            run.append(i)
    flush()


# --- declarations -------------------------------------------------------------------------------
def _head(decl: Decl, name_width: int) -> str:
    if isinstance(decl, ClusterDecl | ScheduleDecl | TrainDecl):
        return {ClusterDecl: "cluster", ScheduleDecl: "schedule", TrainDecl: "train"}[type(decl)]
    keyword = {ModalityDecl: "modality", TaskDecl: "task", MixDecl: "mix"}[type(decl)]
    return f"{keyword} {decl.name.name.ljust(name_width)}"


def _compact(decl: Decl, name_width: int) -> str:
    """The block on one line: ``modality text { tokens = 77; vocab = 49408 }``."""
    stmts = children(decl)
    inner = "; ".join(_statement(s) for s in stmts)
    return (
        f"{_head(decl, name_width)} {{ {inner} }}" if stmts else f"{_head(decl, name_width)} {{}}"
    )


def _block(decl: Decl, att: Attached, name: int = 0) -> list[Line]:
    stmts = children(decl)
    head = _head(decl, name)
    trailing = att.trailing.get(id(decl))
    one_line_source = decl.loc.line == decl.loc.end_line
    if one_line_source and not att.inside(decl) and len(_compact(decl, 0)) <= LINE_LENGTH:
        return [(_compact(decl, name), trailing)]
    lines: list[Line] = [(f"{head} {{", att.header.get(id(decl)))]
    body = _body(list(stmts), att.standalone.get(id(decl), []), att, top=False)
    lines.extend(None if ln is None else (INDENT + ln[0], ln[1]) for ln in body)
    lines.append(("}", trailing))
    return lines


def _module(d: ModuleDecl, att: Attached, keyword: int = 0, name: int = 0) -> list[Line]:
    head = f"{d.keyword.ljust(keyword)} {d.name.name.ljust(name)} : {d.kind.name}("
    tail = ")"
    if d.modality is not None:
        tail += f" <- {d.modality.name}"
    if d.frozen:
        tail += " frozen"
    if d.weights is not None:
        tail += f" from {value_text(d.weights)}"
    for option in d.options:
        tail += f" {_setting(option)}"
    trailing = att.trailing.get(id(d))
    source = [value_text(d.source)] if d.source is not None else []  # hf("DIR") first
    args = ", ".join(source + [_setting(a) for a in d.args])
    unpadded = len(f"{d.keyword} {d.name.name} : {d.kind.name}({args}{tail}")
    if unpadded <= LINE_LENGTH and not att.inside(d):
        return [(head + args + tail, trailing)]
    lines: list[Line] = [(head, att.header.get(id(d)))]
    lines.extend((INDENT + s + ",", att.trailing.get(id(d.source))) for s in source)
    body = _body(list(d.args), att.standalone.get(id(d), []), att, top=False)
    for ln in body:
        if ln is None or ln[0].startswith("#"):
            lines.append(None if ln is None else (INDENT + ln[0], ln[1]))
        else:
            lines.append((INDENT + ln[0] + ",", ln[1]))
    lines.append((tail, trailing))
    return lines


# --- output -----------------------------------------------------------------------------------
def _join(lines: list[Line]) -> str:
    """Align trailing comments in runs of adjacent lines that have one, then join."""
    while lines and lines[0] is None:
        lines.pop(0)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line is None or line[1] is None:
            out.append("" if line is None else line[0].rstrip())
            i += 1
            continue
        j = i
        while j < len(lines) and lines[j] is not None and lines[j][1] is not None:  # type: ignore[index]
            j += 1
        width = max(len(lines[k][0].rstrip()) for k in range(i, j))  # type: ignore[index]
        for k in range(i, j):
            code, comment = lines[k]  # type: ignore[misc]
            out.append(f"{code.rstrip().ljust(width)}  {comment}")
        i = j
    return "\n".join(out).rstrip("\n") + "\n" if out else ""
