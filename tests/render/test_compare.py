"""A measured trace read back, set against the plan, and shown by compare and the report."""

from __future__ import annotations

import json

import pytest

from spindle_dsl.cli import main
from spindle_dsl.cost import make_cost_model
from spindle_dsl.errors import SpindleError
from spindle_dsl.language import compile_text
from spindle_dsl.planner import make_plan
from spindle_dsl.render.compare import compare, largest_misses
from spindle_dsl.render.measured import read_measured
from spindle_dsl.render.report import build_report
from spindle_dsl.render.trace import Span, chrome_trace

SPEC = """
cluster { devices = 2; device = "cpu" }
modality text  { tokens = 8; vocab = 32 }
modality audio { tokens = 8; features = 4 }
encoder ear : transformer(layers = 2, hidden = 16, heads = 2) <- audio
module  lm  : transformer(layers = 2, hidden = 16, heads = 2, causal = true, vocab = 32)
task chat { audio -> ear -> lm; text -> lm; loss = lm; batch = 8 }
"""


@pytest.fixture(scope="module")
def plan():
    graph = compile_text(SPEC).graph
    return make_plan(graph, make_cost_model(graph.cluster), scheduler="sequential")


def measured(plan, slow: str, factor: float, steps: int = 3) -> dict:
    """A trace like the runtime's: per step and rank, each entry's forward and backward (its
    predicted time, ``factor`` times longer for MetaOp ``slow``), then loss, reduce, optimizer;
    the first step is ten times slower (warm-up)."""
    spans, t = [], 0.0
    for step in range(1, steps + 1):
        warm = 10.0 if step == 1 else 1.0
        start = t
        for w in plan.waves:
            for e in w.entries:
                secs = e.time_s * warm * (factor if e.metaop == slow else 1.0)
                args = {"step": step, "metaop": e.metaop, "stage": 0, "wave": w.index}
                for d in e.devices:
                    spans.append(Span(0, d, "F", t, secs / 3, "forward", args))
                    spans.append(Span(0, d, "B", t + secs / 3, 2 * secs / 3, "backward", args))
                t += secs
        for cat in ("loss", "reduce", "optimizer"):
            for d in range(2):
                spans.append(Span(0, d, cat, t, 1e-3, cat))
            t += 1e-3
        for d in range(2):
            spans.append(Span(0, d, f"step {step}", start, t - start, "step"))
    return chrome_trace(spans, metadata={"source": "measured"})


def test_measured_trace_sums_per_step_and_skips_warm_up(plan) -> None:
    run = read_measured(measured(plan, "chat/lm", 1.0))
    assert run.steps == 3 and run.kept == (2, 3)
    layers = sum(e.time_s for w in plan.waves for e in w.entries)
    assert run.step_s == pytest.approx(layers + 3e-3)
    assert run.term("compute_s") == pytest.approx(layers)
    assert run.term("optimizer_s") == pytest.approx(1e-3)
    assert dict(run.metaops)["chat/lm"] == pytest.approx(
        sum(e.time_s for w in plan.waves for e in w.entries if e.metaop == "chat/lm")
    )


def test_compare_puts_the_largest_miss_first(plan) -> None:
    rows = compare(plan, read_measured(measured(plan, "chat/lm", 3.0)))
    assert rows[0].kind == "step"
    top = largest_misses(rows, 1)[0]
    assert top.name in ("chat/lm", f"wave {_wave_of(plan, 'chat/lm')}")
    assert top.ratio > 2.5
    sizes = [abs(r.miss_s) for r in rows[1:]]
    assert sizes == sorted(sizes, reverse=True)


def _wave_of(plan, metaop: str) -> int:
    return next(w.index for w in plan.waves for e in w.entries if e.metaop == metaop)


def test_compare_command_prints_a_table_and_json(plan, tmp_path, capsys) -> None:
    plan_file, trace_file = tmp_path / "plan.json", tmp_path / "trace.json"
    plan.write(plan_file)
    trace_file.write_text(json.dumps(measured(plan, "chat/lm", 2.0)))
    assert main(["compare", str(plan_file), str(trace_file), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "predicted" in out and len(out.splitlines()) == 2 + 1 + 3  # title, head, step, 3
    assert main(["compare", str(plan_file), str(trace_file)]) == 0
    assert "metaop chat/lm" in capsys.readouterr().out
    assert main(["compare", str(plan_file), str(trace_file), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["steps"] == [2, 3] and data["rows"][0]["kind"] == "step"
    trace_file.write_text(json.dumps({"traceEvents": []}))
    assert main(["compare", str(plan_file), str(trace_file)]) == 1
    assert "no step spans" in capsys.readouterr().err


def test_a_trace_that_is_not_one_says_so(tmp_path) -> None:
    from spindle_dsl.render.measured import load_trace

    bad = tmp_path / "t.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SpindleError, match="not a Chrome trace"):
        load_trace(bad)


def test_report_draws_the_measured_step_under_the_prediction(plan) -> None:
    report = build_report(plan, measured=measured(plan, "chat/lm", 2.0))
    assert 'id="measured-step"' in report.html and "largest miss first" in report.html
    assert 'id="measured-step"' not in build_report(plan).html
