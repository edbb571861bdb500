"""From text to the token chunks the parser reads: lexing, line wrapping, and chunking.

Three jobs sit between lark's lexer and its parser, and each exists to make errors better:

* A bad character is reported and blanked out, and lexing goes on, so one stray ``@`` does not
  hide the rest of the file's problems.
* A newline that cannot end a statement (inside brackets, or after ``->``, ``=``, ``:``...) is
  dropped, so long declarations may wrap without a continuation character.
* The stream is cut before every declaration keyword. Keywords are reserved, so a cut there is
  always right, and a block whose ``}`` is missing ends at the next declaration instead of
  swallowing the rest of the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters

from spindle_dsl.errors import Diagnostic, SourceSpan
from spindle_dsl.language.ast import Comment

DECL_KEYWORDS = frozenset(
    {"CLUSTER", "MODALITY", "ENCODER", "MODULE", "SHARED", "TASK", "MIX", "SCHEDULE", "TRAIN"}
)
KEYWORDS = DECL_KEYWORDS | {"FROZEN", "FROM"}
# A newline right after one of these continues the statement on the next line.
_CONTINUES = frozenset({"ARROW", "LARROW", "EQUAL", "COLON", "COMMA", "LPAR", "LSQB", "FROM"})
_OPENS = frozenset({"LPAR", "LSQB"})
_CLOSES = frozenset({"RPAR", "RSQB"})
_MAX_LEX_ERRORS = 20


@dataclass(frozen=True)
class Lexed:
    """The significant tokens, the comments, and what could not be lexed."""

    tokens: tuple[Token, ...]
    comments: tuple[Comment, ...]
    errors: tuple[Diagnostic, ...]


def lex(parser: Lark, text: str, path: str) -> Lexed:
    """Lex ``text``; every bad character becomes one error and is skipped."""
    errors: list[Diagnostic] = []
    while True:
        try:
            raw = list(parser.lex(text, dont_ignore=True))
            break
        except UnexpectedCharacters as exc:
            errors.append(_bad_character(text, exc, path))
            if len(errors) >= _MAX_LEX_ERRORS:
                errors.append(Diagnostic("error", "too many bad characters; stopped reading"))
                return Lexed((), (), tuple(errors))
            text = _blank_out(text, exc.pos_in_stream)
    comments = tuple(
        Comment(t.value.rstrip(), t.line or 0, t.column or 0) for t in raw if t.type == "COMMENT"
    )
    return Lexed(_significant(raw), comments, tuple(errors))


def _bad_character(text: str, exc: UnexpectedCharacters, path: str) -> Diagnostic:
    char = text[exc.pos_in_stream]
    span = SourceSpan(path, exc.line, exc.column, exc.column + 1)
    if char == '"':
        return Diagnostic(
            "error", "unterminated string", span, hint='close the string with " on the same line'
        )
    shown = repr(char) if char.isprintable() and not char.isspace() else f"U+{ord(char):04X}"
    return Diagnostic("error", f"unexpected character {shown}", span)


def _blank_out(text: str, pos: int) -> str:
    """Replace the bad character (an unterminated string: the rest of its line) by spaces, so
    that every later token keeps its line and column."""
    end = pos + 1
    if text[pos] == '"':
        newline = text.find("\n", pos)
        end = len(text) if newline < 0 else newline
    return text[:pos] + " " * (end - pos) + text[end:]


def _significant(raw: list[Token]) -> tuple[Token, ...]:
    """Drop whitespace, comments and the newlines that cannot end a statement."""
    out: list[Token] = []
    depth = 0
    for tok in raw:
        kind = tok.type
        if kind in ("WS", "COMMENT"):
            continue
        if kind == "_NL":
            if depth > 0 or not out or out[-1].type in _CONTINUES or out[-1].type == "_NL":
                continue
        elif kind in _OPENS:
            depth += 1
        elif kind in _CLOSES:
            depth = max(depth - 1, 0)
        elif kind in DECL_KEYWORDS or kind in ("LBRACE", "RBRACE"):
            depth = 0  # an unclosed ( must not swallow the newlines of the rest of the file
        out.append(tok)
    return tuple(out)


def chunks(tokens: tuple[Token, ...]) -> list[tuple[Token, ...]]:
    """Cut before each declaration keyword; the first chunk may hold stray tokens."""
    out: list[list[Token]] = [[]]
    for tok in tokens:
        if tok.type in DECL_KEYWORDS and out[-1]:
            out.append([])
        out[-1].append(tok)
    return [tuple(c) for c in out if any(t.type != "_NL" for t in c)]
