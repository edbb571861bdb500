"""The plan's gap to its lower bound, split term by term: the terms add up to the gap, the
floors they subtract are the bound's own, and every view of a plan words them alike."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from spindle_dsl.cli.cmd_plan import summary, summary_text
from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_text
from spindle_dsl.plan.model import GAP_TERMS, Plan
from spindle_dsl.planner import make_plan
from spindle_dsl.planner.bound.floors import step_floor
from spindle_dsl.render.gap import gap_terms, gap_text
from spindle_dsl.render.report import build_report
from spindle_dsl.widgets.summary import summarize, summary_html

SPEC = """
cluster { devices = 6; device = "cpu" }
modality audio { tokens = 20; features = 8 }
modality text  { tokens = 10; vocab = 48 }
encoder ears   : transformer(layers = 2, hidden = 24, heads = 2) <- audio
module  bridge : mlp(in = 24, out = 32)
shared  lm     : transformer(layers = 3, hidden = 32, heads = 2, causal = true, vocab = 48)
task transcribe { audio -> ears -> bridge -> lm; text -> lm; loss = lm }
task chat       { text -> lm; loss = lm }
task pair       { audio -> ears -> bridge; text -> lm; loss = contrastive }
mix default { global_batch = 18; transcribe = 1; chat = 1; pair = 1 }
"""


@pytest.fixture(scope="module")
def planned() -> tuple[Plan, object]:
    graph = compile_text(SPEC).graph
    cost = make_cost_model(graph.cluster)
    return make_plan(graph, cost, time_limit_s=0.3), cost.step_model(graph)


def test_the_terms_add_up_to_the_gap(planned) -> None:
    plan, _ = planned
    split = plan.gap_split()
    assert split is not None
    terms = dict(split)
    assert set(terms) <= set(GAP_TERMS)
    assert sum(terms.values()) == pytest.approx(plan.iteration_s - plan.lower_bound_s, abs=1e-12)
    # the transfers and wave overheads have no floor: the whole term is gap
    breakdown = dict(plan.breakdown)
    assert terms["transfer_s"] == breakdown["transfer_s"]
    assert terms["wave_overhead_s"] == breakdown["wave_overhead_s"]
    # what the bound holds beyond the LP and the floors is never negative (it only tightens)
    assert terms["bound_s"] <= 1e-12


def test_the_floors_recorded_are_the_step_floors_at_the_bounds_k(planned) -> None:
    plan, step = planned
    b = plan.extra["bounds"]
    floors = b["floors"]
    k = floors["micro_batches"]
    assert k in b["micro_batches"]
    f = step_floor(step, k)
    assert floors["loss_s"] == pytest.approx(k * f.loss_s)
    assert floors["optimizer_s"] == pytest.approx(f.optimizer_s)
    assert floors["closing_s"] == pytest.approx(f.closing_s)
    # the bound's step floors hold at least these (the LP weighing the optimizer adds to them)
    assert b["step_floor_s"] >= (floors["loss_s"] + floors["optimizer_s"] + floors["closing_s"]) * (
        1 - 1e-9
    )


def test_the_split_survives_the_plan_file(planned) -> None:
    plan, _ = planned
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert dict(again.gap_split()) == pytest.approx(dict(plan.gap_split()))


def test_a_plan_whose_bound_records_no_floors_has_no_split(planned) -> None:
    plan, _ = planned
    bounds = {k: v for k, v in plan.extra["bounds"].items() if k != "floors"}
    older = replace(plan, extra={**plan.extra, "bounds": bounds})
    assert older.gap_split() is None
    assert "gap to the bound" not in summary_text(summary(older))
    assert "gap to bound" not in summary_html(summarize(older))


def test_every_view_words_the_split_alike(planned) -> None:
    plan, _ = planned
    split = dict(plan.gap_split())
    line = gap_text(split)
    gap_ms = (plan.iteration_s - plan.lower_bound_s) * 1e3
    assert line is not None and line.startswith(f"gap to the bound: {gap_ms:.2f} ms = ")
    words, secs, _ = gap_terms(split)[0]
    assert abs(secs) == max(abs(v) for v in split.values())  # the largest term first
    assert line in summary_text(summary(plan)).splitlines()
    assert words in summary_html(summarize(plan))
    html = build_report(plan).html
    assert line[0].upper() + line[1:] in html.replace("&#x27;", "'")


def test_a_nil_gap_is_not_split() -> None:
    assert gap_terms({}) == [] and gap_text({}) is None
    assert gap_text({"compute_s": 0.0, "bound_s": 0.0}) is None
    # a negative term reads as a subtraction
    line = gap_text({"compute_s": 2e-3, "bound_s": -1e-3})
    assert line == (
        "gap to the bound: 1.00 ms = compute over the LP 2.00 (200%)"
        " - bound beyond the LP and floors 1.00 (100%)"
    )
