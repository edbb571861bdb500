"""Parse ``.spindle`` text into a ``Spec``, reporting every independent syntax error.

The grammar is package data (``spindle_dsl.grammar/spindle.lark``) and the LALR tables are
built on first use and cached, so importing the package stays cheap and later parses pay
nothing for them. Declarations are parsed one chunk at a time (see ``tokens.chunks``); inside
a block, a bad statement is reported and skipped and the rest of the block is still parsed.
When a file has syntax errors it is not checked further: the meaning of a half-parsed file is
a guess, and errors about a guess mislead more than they help.
"""

from __future__ import annotations

import functools
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedToken

from spindle_dsl.errors import Diagnostic, SpecError
from spindle_dsl.language import syntax_errors
from spindle_dsl.language.ast import Decl, Spec
from spindle_dsl.language.build import LiteralError, build_decls
from spindle_dsl.language.tokens import DECL_KEYWORDS, KEYWORDS, chunks, lex

GRAMMAR_PACKAGE = "spindle_dsl.grammar"
GRAMMAR_FILE = "spindle.lark"
_SEPARATORS = ("_NL", "SEMICOLON")
_OPENERS = {"LBRACE": "RBRACE", "LPAR": "RPAR", "LSQB": "RSQB"}


@functools.cache
def lark_parser() -> Lark:
    """The LALR parser for the grammar, built once per process."""
    text = resources.files(GRAMMAR_PACKAGE).joinpath(GRAMMAR_FILE).read_text(encoding="utf-8")
    return Lark(
        text,
        parser="lalr",
        lexer="basic",
        propagate_positions=True,
        maybe_placeholders=False,
    )


def parse(text: str, path: str = "<string>") -> Spec:
    """The ``Spec`` of ``text``; raises ``SpecError`` with every syntax error found."""
    parser = lark_parser()
    text = text.removeprefix("\ufeff")  # a byte-order mark is invisible and means nothing
    lexed = lex(parser, text, path)
    errors: list[Diagnostic] = list(lexed.errors)
    bad_lines = sorted(d.span.line for d in lexed.errors if d.span is not None)
    decls: list[Decl] = []
    parts = chunks(_keywords_as_names(list(lexed.tokens), errors, path))
    for i, chunk in enumerate(parts):
        nxt = parts[i + 1][0] if i + 1 < len(parts) else None
        tree, chunk_errors = _parse_chunk(list(chunk), nxt, path)
        first, last = chunk[0].line or 0, (nxt.line or 0) if nxt is not None else 10**9
        blanked = [line for line in bad_lines if first <= line <= last]
        if blanked:  # a blanked-out bad character explains what follows it; do not pile on
            chunk_errors = [d for d in chunk_errors if d.span and d.span.line < blanked[0]]
        errors.extend(chunk_errors)
        if tree is None:
            continue
        try:
            decls.extend(build_decls(tree))
        except LiteralError as exc:
            span = syntax_errors.token_span(exc.token, path)
            errors.append(Diagnostic("error", str(exc), span))
    if errors:
        errors.sort(key=lambda d: (d.span.line, d.span.column) if d.span else (10**9, 0))
        raise SpecError(errors, source=text)
    return Spec(tuple(decls), path, text, lexed.comments)


def _keywords_as_names(toks: list[Token], errors: list[Diagnostic], path: str) -> tuple[Token, ...]:
    """``task mix { ... }``: report the keyword used as a name once, then read it as a name,
    so that the chunking does not cut the declaration in two and report it twice."""
    for i in range(1, len(toks)):
        named = toks[i - 1].type in DECL_KEYWORDS - {"CLUSTER", "SCHEDULE", "TRAIN"}
        if named and toks[i].type in KEYWORDS:
            errors.append(
                Diagnostic(
                    "error",
                    f"'{toks[i]}' is a keyword and cannot be used as a name",
                    syntax_errors.token_span(toks[i], path),
                    hint="choose another name",
                )
            )
            toks[i] = Token.new_borrow_pos("NAME", str(toks[i]), toks[i])
    return tuple(toks)


def _feed(tokens: list[Token]) -> Tree:
    """Run the parser over pre-lexed tokens (one chunk)."""
    ip = lark_parser().parse_interactive()
    for tok in tokens:
        ip.feed_token(tok)
    return ip.feed_eof(tokens[-1])


def _probe(snippet: str) -> tuple[UnexpectedToken, str] | None:
    """Parse a malformed example the way a file is parsed; its first error and context."""
    toks = list(lex(lark_parser(), snippet, "<example>").tokens)
    try:
        _feed(toks)
    except UnexpectedToken as exc:
        index = next((i for i, t in enumerate(toks) if t is exc.token), len(toks))
        return exc, _context(toks, index)
    return None


def _context(toks: list[Token], index: int) -> str:
    """The innermost bracket open before ``toks[index]``, as its character ("" for none)."""
    opener = _unclosed_opener(toks[:index])
    return str(opener) if opener is not None else ""


def _parse_chunk(
    toks: list[Token], nxt: Token | None, path: str
) -> tuple[Tree | None, list[Diagnostic]]:
    """Parse one declaration; skip bad statements inside its block and try again."""
    errors: list[Diagnostic] = []
    for _ in range(len(toks) + 1):
        try:
            return _feed(toks), errors
        except UnexpectedToken as exc:
            index = next((i for i, t in enumerate(toks) if t is exc.token), len(toks))
            errors.append(_diagnose(exc, toks, index, nxt, path))
            cut = _statement_range(toks, index)
            if cut is None:
                return None, errors
            del toks[cut[0] : cut[1]]
    return None, errors


def _diagnose(
    exc: UnexpectedToken, toks: list[Token], index: int, nxt: Token | None, path: str
) -> Diagnostic:
    context = _context(toks, index)
    if index < len(toks):
        return syntax_errors.unexpected(exc, toks[index], context, path, _probe)
    opener = _unclosed_opener(toks)
    if opener is not None:
        return syntax_errors.unclosed(_describe_decl(toks, opener), opener, nxt, path)
    if nxt is not None:
        return syntax_errors.unexpected(exc, nxt, context, path, _probe)
    last = toks[-1]
    expected = syntax_errors.describe_expected(set(exc.expected))
    return Diagnostic(
        "error",
        f"unexpected end of file; expected {expected}",
        syntax_errors.token_span(last, path),
    )


def _unclosed_opener(toks: list[Token]) -> Token | None:
    """The innermost bracket still open at the end of the chunk."""
    stack: list[Token] = []
    for tok in toks:
        if tok.type in _OPENERS:
            stack.append(tok)
        elif stack and tok.type == _OPENERS[stack[-1].type]:
            stack.pop()
    return stack[-1] if stack else None


def _describe_decl(toks: list[Token], opener: Token) -> str:
    """ "task 'caption'" (or "the arguments of encoder 'x'" for an open parenthesis)."""
    keyword = str(toks[0])
    name = toks[1] if len(toks) > 1 and toks[1].type == "NAME" else None
    what = f"{keyword} '{name}'" if name is not None else f"the {keyword} block"
    if opener.type == "LPAR":
        return f"the arguments of {what}"
    if opener.type == "LSQB":
        return f"a token count in {what}"
    return what


def _statement_range(toks: list[Token], index: int) -> tuple[int, int] | None:
    """The statement around ``toks[index]`` when it lies directly in the block's body."""
    depth = 0
    start: int | None = None
    for i in range(min(index, len(toks))):
        kind = toks[i].type
        if kind == "LBRACE":
            depth += 1
            if depth == 1:
                start = i + 1
        elif kind == "RBRACE":
            depth -= 1
        elif kind in _SEPARATORS and depth == 1:
            start = i + 1
    if depth != 1 or start is None or index >= len(toks):
        return None
    end = index
    while end < len(toks) and toks[end].type not in (*_SEPARATORS, "RBRACE"):
        end += 1
    return (start, end) if end > start else None
