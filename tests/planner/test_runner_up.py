"""The lever search's last word goes to the MILP where the quick plans cannot tell settings
apart: a k past the first that fits is still judged, and the quickest setting at another k
within ``RUNNER_UP_MARGIN`` of the best is planned with the MILP too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_file
from spindle_dsl.planner import RUNNER_UP_MARGIN, _quick, _runner_up, make_plan
from spindle_dsl.planner.levers import Levers
from spindle_dsl.planner.leversearch import Fit, LeverSearch, Trial


def trial(k: int, seconds: float | None, fits: bool = True) -> Trial:
    """A trial at k whose quick plan took ``seconds`` (None: nothing judged)."""
    ctx = SimpleNamespace(levers=Levers(k))
    judged = () if seconds is None else (SimpleNamespace(fits=fits, iteration_s=seconds),)
    return Trial(Levers(k), ctx, judged)  # type: ignore[arg-type]


def fit_of(*trials: Trial) -> Fit:
    fit = Fit()
    for t in trials:
        fit.record(t.levers.micro_batches, t)
    fit.best = min(trials, key=lambda t: t.time_s)
    return fit


def test_the_runner_up_is_the_quickest_other_k_within_the_margin() -> None:
    best, near, nearer, far = trial(4, 10.0), trial(8, 10.4), trial(2, 10.2), trial(16, 12.0)
    fit = fit_of(best, near, nearer, far)
    assert _runner_up(fit, best.ctx) is nearer  # type: ignore[arg-type]
    # the k the plan was made at is never its own runner-up: planned at k=2, the search's
    # best (k=4) is the one to try
    assert _runner_up(fit, nearer.ctx) is best  # type: ignore[arg-type]


def test_no_runner_up_beyond_the_margin_or_without_a_fitting_plan() -> None:
    best = trial(1, 10.0)
    outside = trial(2, 10.0 * (1 + RUNNER_UP_MARGIN) * 1.01)
    overflowing = trial(4, 9.0, fits=False)
    assert _runner_up(fit_of(best, outside, overflowing), best.ctx) is None  # type: ignore[arg-type]
    assert _runner_up(Fit(), best.ctx) is None  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def qwen_128(shared_dir):
    path = shared_dir / "spec" / "qwen_val.spindle"
    return compile_file(path, mix="pretrain", cluster_overrides={"devices": 128}).graph


def test_a_k_past_the_first_that_fits_is_still_judged(qwen_128) -> None:
    """At k=1 the quick plans fit, and k=2 is quicker still (smaller micro-batches scale to
    more devices): the search must not stop at the first k that fits."""
    fit = LeverSearch(qwen_128, make_cost_model(qwen_128.cluster)).search(_quick("default"))
    assert fit.per_k[1].fitting is not None
    assert 2 in fit.per_k
    assert fit.best is not None
    assert fit.best.time_s == min(t.time_s for t in fit.per_k.values())
    assert fit.best.levers.micro_batches > 1


def test_the_plan_says_what_planning_the_runner_up_found(qwen_128) -> None:
    plan = make_plan(qwen_128, make_cost_model(qwen_128.cluster), time_limit_s=0.3)
    note = next(n for n in plan.notes if n.startswith("runner-up levers"))
    assert "behind by the quick plans, planned too" in note
    assert ("(kept)" in note) or ("(not kept)" in note) or ("does not fit" in note)
    # whichever was kept, the plan is the quicker of the two as priced
    if "(kept)" in note:
        assert f"k={plan.micro_batches}," in note.split(", planned too")[0]
