"""Property: whatever a spec file is mangled into, the front end answers with a SpecError
(or a result), never with any other exception, and a file that parses formats losslessly."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spindle_dsl.errors import SpecError
from spindle_dsl.language import compile_text, decode_spec, format_spec, parse

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEEDS = [p.read_text() for p in sorted(EXAMPLES.glob("*.spindle"))] + [
    "modality text { tokens = 8; vocab = 100 }\n"
    "shared lm : transformer(layers = 2, hidden = 32, heads = 2, causal = true, vocab = 100)\n"
    "task a { text -> lm }\ntask b { text[4] -> lm }\nmix m { global_batch = 8; a = 1; b = 3 }\n"
]
TOKEN = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*|[0-9][0-9.]*[A-Za-z/]*|->|<-|.", re.S)


def pieces(text: str) -> list[str]:
    return TOKEN.findall(text)


@st.composite
def mutated(draw) -> bytes:
    """A seed spec after a few token deletions, duplications, swaps and byte insertions."""
    toks = pieces(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "insert"]))
        i = draw(st.integers(0, len(toks) - 1))
        if op == "delete" and len(toks) > 1:
            del toks[i]
        elif op == "duplicate":
            toks.insert(i, toks[i])
        elif op == "swap":
            j = draw(st.integers(0, len(toks) - 1))
            toks[i], toks[j] = toks[j], toks[i]
        else:
            toks.insert(i, draw(st.sampled_from(["", "}", "{", "->", ";", "\n", "(", "=", "task"])))
    data = "".join(toks).encode("utf-8")
    if draw(st.booleans()):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=6)) + data[at:]
    return data


def front_end(data: bytes) -> None:
    try:
        text = decode_spec(data, "m.spindle")
        spec = parse(text, "m.spindle")
    except SpecError as exc:
        assert exc.errors and exc.render()
        return
    once = format_spec(spec)
    assert parse(once) == spec
    assert format_spec(parse(once)) == once
    try:
        compiled = compile_text(text, "m.spindle")
    except SpecError as exc:
        assert exc.errors and exc.render()
        return
    assert len(compiled.graph) > 0
    compiled.render_warnings()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_specs_raise_only_spec_errors(data):
    front_end(data)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_spec_errors(text):
    front_end(text.encode("utf-8", "surrogatepass"))
