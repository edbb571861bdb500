"""The choice of k: the lever search tries the powers of two, then bisects the bracket around
the best (``LeverSearch.between``); its last word goes to the MILP where the quick plans cannot
tell settings apart: a k past the first that fits is still judged, and the quickest settings
at other k within ``RUNNER_UP_MARGIN`` of the best (``RUNNERS_UP`` at most) are planned with
the MILP too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_file
from spindle_dsl.planner import make_plan
from spindle_dsl.planner.model.levers import Levers
from spindle_dsl.planner.search.leversearch import Fit, LeverSearch, Trial, micro_sizes, refine_ks
from spindle_dsl.planner.search.make import RUNNER_UP_MARGIN, RUNNERS_UP, _quick, _runners_up


def trial(k: int, seconds: float | None, fits: bool = True) -> Trial:
    """A trial at k whose quick plan took ``seconds`` (None: nothing judged)."""
    ctx = SimpleNamespace(levers=Levers(k))
    judged = () if seconds is None else (SimpleNamespace(fits=fits, iteration_s=seconds),)
    return Trial(Levers(k), ctx, judged)  # type: ignore[arg-type]


def fit_of(*trials: Trial, binds: bool = True) -> Fit:
    fit = Fit(memory_binds=binds)
    for t in trials:
        fit.record(t.levers.micro_batches, t)
    fit.best = min(trials, key=lambda t: t.time_s)
    return fit


def test_the_runners_up_are_the_quickest_other_k_within_the_margin() -> None:
    best, near, nearer, far = trial(4, 10.0), trial(8, 10.4), trial(2, 10.2), trial(16, 12.0)
    fit = fit_of(best, near, nearer, far)
    assert _runners_up(fit, best.ctx) == (nearer, near)  # type: ignore[arg-type]
    # the k the plan was made at is never its own runner-up: planned at k=2, the search's
    # best (k=4) is the first to try
    assert _runners_up(fit, nearer.ctx) == (best, near)  # type: ignore[arg-type]


def test_at_most_so_many_runners_up() -> None:
    best = trial(1, 10.0)
    close = [trial(k, 10.0 + 0.01 * k) for k in range(2, RUNNERS_UP + 4)]
    got = _runners_up(fit_of(best, *close), best.ctx)  # type: ignore[arg-type]
    assert got == tuple(close[:RUNNERS_UP])
    # where k = 1 fits without recompute, one
    got = _runners_up(fit_of(best, *close, binds=False), best.ctx)  # type: ignore[arg-type]
    assert got == tuple(close[:1])


def test_where_k_was_refined_the_best_power_of_two_is_planned_first() -> None:
    """The quick plans may misjudge the refined pick, so the setting the powers of two alone
    would have planned goes to the MILP too, even beyond the margin."""
    best, coarse, near = trial(3, 10.0), trial(4, 11.0), trial(6, 10.2)
    fit = fit_of(best, coarse, near)
    fit.coarse = coarse
    assert _runners_up(fit, best.ctx) == (coarse, near)  # type: ignore[arg-type]
    # planned at the coarse k itself (the search's best was the power of two): not twice
    assert _runners_up(fit, coarse.ctx) == (best, near)  # type: ignore[arg-type]


def test_no_runner_up_beyond_the_margin_or_without_a_fitting_plan() -> None:
    best = trial(1, 10.0)
    outside = trial(2, 10.0 * (1 + RUNNER_UP_MARGIN) * 1.01)
    overflowing = trial(4, 9.0, fits=False)
    assert _runners_up(fit_of(best, outside, overflowing), best.ctx) == ()  # type: ignore[arg-type]
    assert _runners_up(Fit(), best.ctx) == ()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def qwen_128(spec_dir):
    path = spec_dir / "qwen_val.spindle"
    return compile_file(path, mix="pretrain", cluster_overrides={"devices": 128}).graph


def test_a_k_past_the_first_that_fits_is_still_judged(qwen_128) -> None:
    """At k=1 the quick plans fit, and k=2 is quicker still (smaller micro-batches scale to
    more devices): the search must not stop at the first k that fits."""
    fit = LeverSearch(qwen_128, make_cost_model(qwen_128.cluster)).search(_quick("default"))
    assert fit.per_k[1].fitting is not None
    # k = 1 fits: memory does not bind, so only the powers of two are tried
    assert not fit.memory_binds
    assert all(k & (k - 1) == 0 for k in fit.per_k)
    assert 2 in fit.per_k
    assert fit.best is not None
    assert fit.best.time_s == min(t.time_s for t in fit.per_k.values())
    assert fit.best.levers.micro_batches > 1


def test_the_plan_says_what_planning_the_runner_up_found(qwen_128) -> None:
    plan = make_plan(qwen_128, make_cost_model(qwen_128.cluster))
    notes = [n for n in plan.notes if n.startswith("runner-up levers")]
    assert 1 <= len(notes) <= RUNNERS_UP
    for note in notes:
        assert "behind by the quick plans, planned too" in note
        assert ("(kept)" in note) or ("(not kept)" in note) or ("does not fit" in note)
    # at most one is kept, and it is the plan's setting
    kept = [n for n in notes if n.endswith("(kept)")]
    assert len(kept) <= 1
    for note in kept:
        assert f"k={plan.micro_batches}," in note.split(", planned too")[0]


def test_refine_ks_bisects_the_bracket_around_the_best() -> None:
    assert refine_ks((1, 2, 4, 8, 16, 32), 8) == (6, 12)
    assert refine_ks((1, 2, 4), 2) == (3,)
    assert refine_ks((1, 2, 4), 1) == ()  # nothing whole between 1 and 2
    assert refine_ks((6, 7, 8), 7) == ()
    assert refine_ks((1, 2, 4, 8, 16), 16) == (12,)


def test_a_k_that_only_adds_passes_of_the_same_sizes_is_not_tried(spec_dir) -> None:
    """tiny_mm's MetaOps carry 24 and 8 samples: k=12 splits them as k=16 does (2 and 1) in
    fewer passes, so it is worth trying; k=7 splits them as k=6 does (4 and 2) in one pass
    more, so it is not."""
    tiny = compile_file(spec_dir / "tiny_mm.spindle").graph
    assert micro_sizes(tiny, 12) == micro_sizes(tiny, 16)
    assert micro_sizes(tiny, 7) == micro_sizes(tiny, 6)
    search = LeverSearch(tiny, make_cost_model(tiny.cluster))
    plain = {k: trial(k, 1.0) for k in (1, 2, 4, 8, 16, 32)}

    def best_at(k: int) -> Fit:
        fit = Fit()
        fit.best = plain[k]
        return fit

    assert search.between(plain, best_at(8)) == (6, 12)
    plain[6] = trial(6, 1.0)
    assert search.between(plain, best_at(6)) == (5,)


@pytest.fixture(scope="module")
def qwen_16(spec_dir):
    path = spec_dir / "qwen_val.spindle"
    return compile_file(path, mix="pretrain", cluster_overrides={"devices": 16}).graph


def test_the_search_finds_a_quicker_k_between_the_powers_of_two(qwen_16) -> None:
    """On qwen_val at 16 devices memory binds at every k; as the quick plans judge, k=16
    needs no recompute but is 2.7% behind k=8 (ZeRO-2, 4 MetaOps recomputing), and k=13,
    between them, is quicker than both (its micro-batches fit without either lever)."""
    fit = LeverSearch(qwen_16, make_cost_model(qwen_16.cluster)).search(_quick("default"))
    assert fit.memory_binds and fit.best is not None
    assert fit.coarse is not None and fit.coarse.levers.micro_batches in (8, 16)
    k = fit.best.levers.micro_batches
    assert k & (k - 1), f"the best k is a power of two: {k}"
    powers = [t.time_s for kk, t in fit.per_k.items() if kk & (kk - 1) == 0]
    assert fit.best.time_s < min(powers)
