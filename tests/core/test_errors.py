"""Diagnostics render in the compiler convention with the source line and a caret."""

from spindle_dsl.errors import Diagnostic, SourceSpan, SpecError

SOURCE = "task caption {\n  image -> visoin -> lm\n}\n"


def test_error_renders_location_line_and_caret():
    d = Diagnostic(
        "error",
        "unknown module 'visoin'",
        SourceSpan("a.spindle", 2, 12, 18),
        "did you mean 'vision'?",
    )
    text = d.render(SOURCE)
    lines = text.splitlines()
    assert lines[0] == "a.spindle:2:12: error: unknown module 'visoin'"
    assert lines[1] == "    " + "  image -> visoin -> lm"
    # The caret sits under the span: 11 spaces of column offset, 6 carets for 'visoin'.
    assert lines[2] == "    " + " " * 11 + "^^^^^^"
    assert lines[1][4 + 11 : 4 + 17] == "visoin"
    assert lines[3].strip() == "hint: did you mean 'vision'?"


def test_span_past_the_end_of_source_still_renders_the_head():
    d = Diagnostic("warning", "unused modality", SourceSpan("a.spindle", 99, 1))
    assert d.render(SOURCE) == "a.spindle:99:1: warning: unused modality"


def test_error_keeps_every_diagnostic_and_separates_errors():
    err = SpecError(
        [
            Diagnostic("error", "first", SourceSpan("x", 1, 1)),
            Diagnostic("warning", "careful", SourceSpan("x", 2, 1)),
            Diagnostic("error", "second", SourceSpan("x", 3, 1)),
        ]
    )
    assert [d.message for d in err.errors] == ["first", "second"]
    assert "x:3:1: error: second" in str(err)


def test_plain_message_becomes_one_error():
    err = SpecError("no such file")
    assert err.render() == "error: no such file"
