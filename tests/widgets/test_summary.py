"""The widget's summary table: the bound it shows and the plan's gap to it."""

from __future__ import annotations

from dataclasses import replace

from spindle_dsl.plan.model import ClusterRef, Plan, SolverInfo, SpecRef
from spindle_dsl.widgets.summary import summarize, summary_html


def _plan(**extra) -> Plan:
    return Plan(
        spec=SpecRef("x.spindle", "", None),
        cluster=ClusterRef(8, "cpu", 8, 2**30),
        metaops=(),
        waves=(),
        iteration_s=1.2,
        lower_bound_s=1.0,
        baselines=(("sequential_s", 2.4),),
        solver=SolverInfo("milp", "feasible", 0.5),
        extra=extra,
    )


def test_summary_shows_the_lp_bound_and_the_ratio_to_it():
    s = summarize(_plan(bounds={"lp_s": 1.0, "area_path_s": 0.75}))
    assert s.lp_bound and s.area_path_s == 0.75
    html = summary_html(s)
    assert "LP lower bound" in html and "1.20×" in html and "20.0% above" in html
    assert "area / critical path 750 ms" in html


def test_plans_without_an_lp_figure_say_lower_bound():
    for p in (_plan(), replace(_plan(), extra={"bounds": {"lp_s": None, "area_path_s": 1.0}})):
        s = summarize(p)
        assert not s.lp_bound
        html = summary_html(s)
        assert "LP lower bound" not in html and "lower bound" in html and "1.20×" in html
