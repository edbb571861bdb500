"""Small helpers the language tests share (imported by path: tests run in importlib mode)."""

from __future__ import annotations

import re
from pathlib import Path

from spindle_dsl.errors import Diagnostic, SpecError
from spindle_dsl.language import compile_text

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

# A small valid spec that the tests edit one line at a time.
BASE = """\
modality image { tokens = 16 }
modality text  { tokens = 8; vocab = 100 }
encoder vision : vit(layers = 2, hidden = 32, heads = 2, patch = 4) <- image
module  proj   : mlp(in = 32, out = 64)
shared  lm     : transformer(layers = 2, hidden = 64, heads = 2, causal = true, vocab = 100)
task caption { image -> vision -> proj -> lm; text -> lm }
task chat    { text -> lm }
mix default { global_batch = 8; caption = 1; chat = 1 }
"""


def errors_of(text: str, **kwargs) -> list[Diagnostic]:
    """The errors ``compile_text`` raises for ``text`` (fails the test if it compiles)."""
    try:
        compile_text(text, "t.spindle", **kwargs)
    except SpecError as exc:
        return list(exc.errors)
    raise AssertionError("expected a SpecError, but the spec compiled")


def first_error(text: str, **kwargs) -> Diagnostic:
    return errors_of(text, **kwargs)[0]


def where(d: Diagnostic) -> tuple[int, int]:
    assert d.span is not None, f"diagnostic without a place: {d.message}"
    return d.span.line, d.span.column


EXPECT = re.compile(r"#\s*expect:\s*(\d+)(?::(\d+))?\s*(.*)")


def expectation(text: str) -> tuple[int, int | None, list[str]]:
    """The ``# expect: LINE[:COL] WORD...`` header of a broken fixture."""
    m = EXPECT.search(text.splitlines()[0])
    assert m, "a broken fixture starts with '# expect: LINE[:COL] WORD...'"
    return int(m.group(1)), int(m.group(2)) if m.group(2) else None, m.group(3).split()
