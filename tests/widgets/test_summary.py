"""The widget's summary table: the bound it shows and the plan's gap to it."""

from __future__ import annotations

from dataclasses import replace

from spindle_dsl.plan.model import ClusterRef, Entry, Plan, SolverInfo, SpecRef, Wave
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


def test_summary_says_where_the_compute_over_the_lp_goes():
    # 8 devices: wave 0 lasts 0.5 s with 4 devices busy 0.5 s and 4 busy 0.25 s; wave 1 lasts
    # 0.4 s on all 8: 3.0 + 3.2 device-seconds busy of 7.2, compute 0.9 s over an LP of 0.75 s
    waves = (
        Wave(0, 0.0, 0.5, (Entry("t/a", 0, 1, tuple(range(4)), 0.5),
                           Entry("u/b", 0, 1, tuple(range(4, 8)), 0.25))),
        Wave(1, 0.5, 0.4, (Entry("t/a", 1, 2, tuple(range(8)), 0.4),)),
    )  # fmt: skip
    s = summarize(replace(_plan(bounds={"lp_s": 0.75}), waves=waves))
    assert s.compute_over_lp == 0.9 / 0.75
    assert abs(s.busy_over_lp - 6.2 / 8 / 0.75) < 1e-12
    assert abs(s.idle_share - (1 - 6.2 / 7.2)) < 1e-12
    assert "1.20× (entries 1.03× the LP's device-seconds, 13.9% idle inside waves)" in (
        summary_html(s)
    )
    assert summarize(_plan(bounds={"lp_s": 0.75})).compute_over_lp is None  # no waves
    assert "compute / LP bound" not in summary_html(summarize(_plan()))
