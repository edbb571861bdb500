"""Name a syntax error the way a person would, not as a parser state.

LALR knows only "token X is not in set Y". Users need "the '{' of task 'caption' is never
closed" or "a kind argument needs 'name = value'". Structural cases (an unclosed block, end of
file, a keyword used as a name) are decided from the tokens; the rest are named by matching
the parser state against a table of small malformed examples, as lark's
``match_examples`` does; whatever matches nothing gets "unexpected X; expected Y".
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from lark import Token
from lark.exceptions import UnexpectedToken

from spindle_dsl.errors import Diagnostic, SourceSpan
from spindle_dsl.language.suggest import closest
from spindle_dsl.language.tokens import DECL_KEYWORDS, KEYWORDS

_PUNCT = {
    "LBRACE": "{",
    "RBRACE": "}",
    "LPAR": "(",
    "RPAR": ")",
    "LSQB": "[",
    "RSQB": "]",
    "EQUAL": "=",
    "COLON": ":",
    "COMMA": ",",
    "SEMICOLON": ";",
    "ARROW": "->",
    "LARROW": "<-",
}
_CLASSES = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "SIZE": "a size such as 80GB",
    "_NL": "a new line",
    "$END": "the end of the file",
}
# Parses a snippet and returns its first error with the bracket open there, None if it parses.
Probe = Callable[[str], "tuple[UnexpectedToken, str] | None"]

_DECL_WORDS = "cluster, modality, encoder, module, shared, task, mix, schedule or train"

# Labels for parser states, each shown by a few malformed snippets that stop in that state.
EXAMPLES: dict[str, list[str]] = {
    "expected '=' between a key and its value": [
        "modality m { tokens 3 }",
        "cluster { devices 8 }",
        "mix m { global_batch 8 }",
        "module m : mlp(in 3)",
    ],
    "a kind argument is written 'name = value'": ["module m : mlp(1)", "module m : mlp(in = 1, 2)"],
    "kind arguments are separated by ','": ["module m : mlp(in = 1 out = 2)"],
    "expected ':' and a kind after the module's name": [
        "module m mlp(in = 1)",
        "encoder e vit(layers = 1) <- x",
    ],
    "expected a kind after ':' (such as transformer, vit, mlp, resampler)": [
        "module m : (in = 1)",
        "module m : = 1",
    ],
    "expected a modality name after '<-'": ["encoder e : vit(layers = 1) <- 3"],
    "expected the weights file in quotes after 'from' (from \"w.safetensors\")": [
        "module m : mlp(in = 1) from w",
        "module m : mlp(in = 1) from 3",
        "encoder e : vit(layers = 1) <- x frozen from",
    ],
    "expected '{' after the declaration's name": [
        "modality m tokens = 3 }",
        "task t a -> b }",
        "mix m global_batch = 8 }",
    ],
    "expected a name for the declaration": ["modality { tokens = 3 }", "task { a -> b }"],
    "expected a module after '->'": [
        "task t { a -> }",
        "task t { a -> -> b }",
        "task t { a -> b -> }",
        "task t { a -> b -> 3 }",
    ],
    "a token count is a whole number in brackets, as in text[256]": [
        "task t { a[x] -> b }",
        "task t { a[1 -> b }",
        "task t { a[] -> b }",
    ],
    "a statement in a task is a path (a -> b) or a setting (batch = 8)": [
        "task t { a }",
        "task t { a b }",
    ],
    "a value must follow '='": [
        "modality m { tokens = }",
        "modality m { tokens = = 3 }",
        "task t { batch = }",
        "mix m { a = }",
        "cluster { devices = }",
        "module m : mlp(in = )",
    ],
    "a setting holds a single value": ["modality m { tokens = 3 4 }", "cluster { devices = 8 2 }"],
    "a schedule entry is 'STEP: MIX', as in 3: main": [
        "schedule { warmup }",
        "schedule { 0 warmup }",
        "schedule { 0: }",
        "schedule { 0: 3 }",
        "schedule { 0: a b }",
        "schedule { 0 = a }",
    ],
    "a schedule has no name: schedule { 0: MIX ... }": ["schedule s { 0: a }"],
    "the train block has no name: train { steps = 100 ... }": ["train t { steps = 1 }"],
}


def describe_token(tok: Token) -> str:
    """A token as prose: "name 'foo'", "'{'", "keyword 'task'", "the end of the file"."""
    kind = tok.type
    if kind in _PUNCT:
        return f"'{_PUNCT[kind]}'"
    if kind in KEYWORDS:
        return f"keyword '{tok}'"
    if kind in ("_NL", "$END"):
        return "end of line" if kind == "_NL" else "end of file"
    noun = {"NAME": "name", "NUMBER": "number", "STRING": "string", "SIZE": "size"}.get(kind, kind)
    return f"{noun} '{tok}'" if kind != "STRING" else f"string {tok}"


def describe_expected(expected: set[str] | frozenset[str]) -> str:
    """The set of acceptable token types as an English list."""
    words = []
    decls = sorted(expected & DECL_KEYWORDS)
    if decls:
        words.append(f"a declaration ({_DECL_WORDS})")
    for kind in sorted(expected - DECL_KEYWORDS):
        if kind in _PUNCT:
            words.append(f"'{_PUNCT[kind]}'")
        elif kind in KEYWORDS:
            words.append(f"'{kind.lower()}'")
        else:
            words.append(_CLASSES.get(kind, kind))
    if len(words) <= 1:
        return words[0] if words else "nothing"
    return ", ".join(words[:-1]) + " or " + words[-1]


def token_span(tok: Token, path: str) -> SourceSpan:
    end = tok.end_column if tok.end_line == tok.line else None
    return SourceSpan(path, tok.line or 1, tok.column or 1, end)


def unclosed(what: str, opener: Token, next_tok: Token | None, path: str) -> Diagnostic:
    """A bracket that is never closed: blame the declaration that begins inside it, or, at
    the end of the file, the opening bracket itself."""
    close = {"{": "}", "(": ")", "[": "]"}[str(opener)]
    hint = f"add '{close}' to close {what}"
    if next_tok is not None:
        return Diagnostic(
            "error",
            f"{describe_token(next_tok)} inside {what}: its '{opener}' on line {opener.line} "
            "is never closed",
            token_span(next_tok, path),
            hint=f"{hint} before line {next_tok.line}",
        )
    return Diagnostic(
        "error",
        f"unexpected end of file: the '{opener}' of {what} is never closed",
        token_span(opener, path),
        hint=hint,
    )


def unexpected(
    exc: UnexpectedToken, tok: Token, context: str, path: str, probe: Probe
) -> Diagnostic:
    """A message for ``tok`` arriving where the parser expected ``exc.expected``; ``context``
    is the innermost bracket open at that point ("{", "(", "[" or "")."""
    expected = set(exc.expected)
    span = token_span(tok, path)
    if tok.type in KEYWORDS and "NAME" in expected:
        return Diagnostic(
            "error",
            f"'{tok}' is a keyword and cannot be used as a name",
            span,
            hint="choose another name",
        )
    if expected & DECL_KEYWORDS and "RBRACE" not in expected:
        if tok.type == "RBRACE":
            return Diagnostic("error", "unmatched '}': no block is open here", span)
        found = describe_token(tok)
        message = f"expected a declaration ({_DECL_WORDS}), found {found}"
        if tok.type == "NAME":
            best = closest(str(tok), [k.lower() for k in DECL_KEYWORDS])
            if best:
                message += f" (did you mean '{best}'?)"
        return Diagnostic("error", message, span)
    label = _match_example(exc, context, probe)
    found = describe_token(tok)
    if label is not None:
        return Diagnostic("error", f"{label}; found {found}", span)
    return Diagnostic("error", f"unexpected {found}; expected {describe_expected(expected)}", span)


def _match_example(exc: UnexpectedToken, context: str, probe: Probe) -> str | None:
    """The label of the example that stops in the same parser state and bracket as ``exc``.

    Like lark's ``match_examples``, but keyed on the LALR state and the innermost open bracket
    rather than the whole state stack: the stack is deeper at a block's tenth statement than
    at its first, which should not matter, while LALR merges states (``value: NUMBER .``) that
    a kind's argument list and a block share, which should.
    """
    state = getattr(exc.state, "position", None)
    return _example_states(probe).get((state, context)) if state is not None else None


@functools.cache
def _example_states(probe: Probe) -> dict[tuple[int, str], str]:
    table: dict[tuple[int, str], str] = {}
    for label, snippets in EXAMPLES.items():
        for snippet in snippets:
            found = probe(snippet)
            if found is None:
                raise AssertionError(f"syntax example parses without error: {snippet!r}")
            exc, context = found
            table.setdefault((exc.state.position, context), label)
    return table
