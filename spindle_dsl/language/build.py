"""lark parse trees to the frozen AST of ``ast.py``.

This is the only module that knows the grammar's rule names. Literal values are converted
here, once, so the checker compares numbers rather than strings; a literal that cannot become
a value (a number too large to be exact, a bad escape) is reported like a syntax error.
"""

from __future__ import annotations

import math
import re

from lark import Token, Tree

from spindle_dsl.language.ast import (
    ClusterDecl,
    Decl,
    Ident,
    Loc,
    MixDecl,
    ModalityDecl,
    ModuleDecl,
    Path,
    ScheduleDecl,
    ScheduleEntry,
    Setting,
    TaskDecl,
    TrainDecl,
    Value,
)

# Integers beyond this lose exactness as floats, and no layer count, width or batch comes near.
MAX_INT = 2**53
_INT = re.compile(r"-?[0-9]+\Z")
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(.*)\Z")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t"}


class LiteralError(Exception):
    """A literal the grammar accepts but no value can hold; carries the offending token."""

    def __init__(self, message: str, token: Token):
        super().__init__(message)
        self.token = token


def token_loc(tok: Token) -> Loc:
    return Loc(tok.line or 0, tok.column or 0, tok.end_line or 0, tok.end_column or 0)


def _tree_loc(tree: Tree) -> Loc:
    m = tree.meta
    if getattr(m, "empty", True):
        return Loc(0, 0, 0, 0)
    return Loc(m.line, m.column, m.end_line, m.end_column)


def _ident(tok: Token) -> Ident:
    return Ident(str(tok), token_loc(tok))


def build_decls(tree: Tree) -> list[Decl]:
    """The declarations of one parsed chunk (the ``start`` tree), in order."""
    builders = {
        "cluster": _cluster,
        "modality": _modality,
        "module": _module,
        "task": _task,
        "mix": _mix,
        "schedule": _schedule,
        "train": _train,
    }
    return [builders[child.data](child) for child in tree.children if isinstance(child, Tree)]


def _settings(children: list) -> tuple[Setting, ...]:
    return tuple(_setting(c) for c in children if isinstance(c, Tree) and c.data == "setting")


def _cluster(tree: Tree) -> ClusterDecl:
    return ClusterDecl(_settings(tree.children), _tree_loc(tree))


def _modality(tree: Tree) -> ModalityDecl:
    name = tree.children[1]
    return ModalityDecl(_ident(name), _settings(tree.children), _tree_loc(tree))


def _module(tree: Tree) -> ModuleDecl:
    keyword, name, kind, *rest = tree.children
    args: tuple[Setting, ...] = ()
    modality = None
    frozen = False
    weights = None
    options: list[Setting] = []
    source = None
    for part in rest:
        if part.data == "kind_args":
            args = _settings(part.children)
            source = _source(part.children)
        elif part.data == "binding":
            modality = _ident(part.children[1])
        elif part.data == "frozen":
            frozen = True
        elif part.data == "weights":
            weights = _value(part.children[1])
        elif part.data == "module_option":
            options.append(_setting(part))
    return ModuleDecl(
        str(keyword),  # type: ignore[arg-type]
        _ident(name),
        _ident(kind),
        args,
        modality,
        frozen,
        weights,
        _tree_loc(tree),
        tuple(options),
        source,
    )


def _source(children: list) -> Value | None:
    """A kind's one positional string (``hf("DIR")``); a second one is an error."""
    found = [c.children[0] for c in children if isinstance(c, Tree) and c.data == "source"]
    if len(found) > 1:
        raise LiteralError("a kind takes one folder string; this is a second one", found[1])
    return _value(found[0]) if found else None


def _task(tree: Tree) -> TaskDecl:
    body: list[Path | Setting] = []
    for child in tree.children[2:]:
        if isinstance(child, Tree):
            body.append(_setting(child) if child.data == "setting" else _path(child))
    return TaskDecl(_ident(tree.children[1]), tuple(body), _tree_loc(tree))


def _path(tree: Tree) -> Path:
    head, *rest = tree.children
    first = _ident(head.children[0])
    count = _number(head.children[1]) if len(head.children) > 1 else None
    steps = [first] + [_ident(t) for t in rest if t.type == "NAME"]
    return Path(tuple(steps), count, _tree_loc(tree))


def _mix(tree: Tree) -> MixDecl:
    return MixDecl(_ident(tree.children[1]), _settings(tree.children), _tree_loc(tree))


def _schedule(tree: Tree) -> ScheduleDecl:
    entries = tuple(
        ScheduleEntry(_number(c.children[0]), _ident(c.children[1]), _tree_loc(c))
        for c in tree.children
        if isinstance(c, Tree) and c.data == "schedule_entry"
    )
    return ScheduleDecl(entries, _tree_loc(tree))


def _train(tree: Tree) -> TrainDecl:
    return TrainDecl(_settings(tree.children), _tree_loc(tree))


def _setting(tree: Tree) -> Setting:
    key, value = tree.children
    return Setting(_ident(key), _value(value.children[0]), _tree_loc(tree))


def _value(tok: Token) -> Value:
    loc = token_loc(tok)
    text = str(tok)
    if tok.type == "NUMBER":
        return _number(tok)
    if tok.type == "STRING":
        return Value("string", _unescape(tok), None, loc)
    if tok.type == "SIZE":
        m = _SIZE.match(text)
        assert m is not None, f"SIZE token {text!r} does not match its own pattern"
        number = m.group(1)
        amount: int | float = int(number) if "." not in number else float(number)
        _check_magnitude(amount, tok)
        return Value("size", amount, m.group(2), loc)
    if text in ("true", "false"):
        return Value("bool", text == "true", None, loc)
    return Value("name", text, None, loc)


def _number(tok: Token) -> Value:
    text = str(tok)
    loc = token_loc(tok)
    if _INT.match(text):
        number = int(text)
        _check_magnitude(number, tok)
        return Value("int", number, None, loc)
    value = float(text)
    _check_magnitude(value, tok)
    return Value("float", value, None, loc)


def _check_magnitude(number: int | float, tok: Token) -> None:
    if isinstance(number, float) and not math.isfinite(number):
        raise LiteralError(f"number {tok} is too large", tok)
    if abs(number) > MAX_INT:
        raise LiteralError(f"number {tok} is too large (the limit is 2**53)", tok)


def _unescape(tok: Token) -> str:
    body = str(tok)[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            nxt = body[i + 1]  # the STRING pattern guarantees a character after a backslash
            if nxt not in _ESCAPES:
                raise LiteralError(f"unknown escape '\\{nxt}' in string (use \\\\ or \\\")", tok)
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)
