"""The wave planner: from a MetaGraph and a cost model to a placed, timed wave plan.

``make_plan(graph, cost, scheduler=...)`` is the stage function. Schedulers:

* ``paper``: Spindle's algorithm as published (per-MetaLevel continuous optimum, bi-point
  discretisation, greedy wavefront), see ``wavefront``;
* ``milp``: the levels' waves and five other starts, each with its layers re-split between
  waves (python-mip) and its waves rebalanced, a MILP over all waves where it stays small,
  then local search on the placed plan, see ``rounds.milp_schedule``;
* ``default``: ``milp``, ``paper`` and the baselines all placed and timed with transfers and
  gradient sync, keeping the fastest that fits in memory (the plan says which won);
* ``sequential``, ``distmm``, ``optimus``: the baselines, as plans of their own.

Memory is a planning decision (``leversearch``): with a cost model that prices memory per
parameter part (both built-in models), the planner chooses the number of micro-batches k, the
ZeRO stage and the MetaOps that recompute their activations in one search judged by the placed
plans' iteration time (where other k come within ``RUNNER_UP_MARGIN``, the MILP plans those
too, in helper processes beside this one where cores are spare: ``helpers``), and every
scheduler plans with each MetaOp's minimum device count. The baselines are tuned with the same
levers, so speed-ups compare like with like. The plan records the levers (``micro_batches``,
``zero_stage``, per-MetaOp ``recompute``) and its notes say why.

CPU workers that outnumber their cores share them (``cost.step``): the problem the schedulers
see carries those cores (``Problem.lanes``), a wave lasts at least its work over them, and a
plan may leave workers idle rather than have them take turns (its notes say so).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from spindle_dsl.cost.base import CostModel, has_slice_memory
from spindle_dsl.errors import PlanError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan
from spindle_dsl.planner.bound.floors import level_reference_s, step_floor
from spindle_dsl.planner.bound.floors import lower_bound_s as area_path_bound_s
from spindle_dsl.planner.bound.lp_bound import LpBound, MemoryRoom
from spindle_dsl.planner.bound.lp_bound import lp_bound as lp_relaxation_bound
from spindle_dsl.planner.evaluate.build import (
    Evaluated,
    PlanContext,
    compute_floor,
    context,
    evaluate_cached,
    to_plan,
)
from spindle_dsl.planner.evaluate.relabel import RENAME_NOTE, SPREAD_LOSS_NOTE, relabel_and_spread
from spindle_dsl.planner.model.levers import (
    ALL_PASSES,
    Budget,
    Levers,
    PassOptions,
    PricingCache,
    pass_problem,
)
from spindle_dsl.planner.model.problem import Problem, Schedule
from spindle_dsl.planner.search.helpers import (
    Caught,
    answer,
    has_rounds,
    helper_count,
    kind_modules,
    side_by_side,
    solving_here,
)
from spindle_dsl.planner.search.helpers import start as start_helpers
from spindle_dsl.planner.search.leversearch import SEARCH_SHARE, Fit, Judge, LeverSearch, Trial
from spindle_dsl.planner.search.memfit import memory_room, no_fit_message, overflow_message
from spindle_dsl.planner.search.rounds import (
    Round,
    RoundRequest,
    plan_round,
    remote_round,
)
from spindle_dsl.planner.solver.choice import SolverChoice, choose_solver
from spindle_dsl.planner.solver.isolate import warm_up
from spindle_dsl.planner.starts.baselines import BASELINES
from spindle_dsl.planner.starts.wavefront import paper_schedule

SCHEDULERS: tuple[str, ...] = ("default", "milp", "paper", *BASELINES)
# The whole call's time (``levers.Budget``): what a plan needs runs whatever the clock says,
# and each step that may improve it starts only while its share of the budget is unspent.
# The lever search may go on past its first fitting setting until ``SEARCH_SHARE`` of it
# is spent (``leversearch``); the MILP's round solves within ``ROUND_SHARE`` of it, at most
# ``ROUND_LIMIT_S`` (shared with the runner-up settings, planned only while the search left
# ``SEARCH_SHARE``); each baseline is tuned with its own levers until ``TUNE_SHARE`` is spent
# (after that it is reported at the best setting the plan's own search placed it at, or the
# plan's levers, ``_untuned_at_best``), and the MILP plans again at the levers of a quicker
# baseline, and an untuned baseline's devices are renamed for the report, until
# ``REPLAN_SHARE``. The lower bound is always taken.
DEFAULT_TIME_LIMIT_S = 10.0
# ... of which the round's slow steps (``rounds.SLOW_STEP_S``: 1,024 devices and more) leave
# this much for what follows them: at 1,024 H100s x 48 tasks the plan's assembly takes 0.1 s,
# and the command's output and exit 0.35 s more
FINISH_S = 0.4
ROUND_SHARE = 0.15
ROUND_LIMIT_S = 1.5
TUNE_SHARE = 0.7
REPLAN_SHARE = 0.8
# The lever search judges a setting by the quick plans (the paper's and the baselines'), not
# by the MILP's, and the two can rank close settings differently: on qwen_val at 32 devices the
# quick plans put k=8 just behind k=4, and the MILP's plan at k=8 is quicker than at k=4.
# So the quickest setting at another k that the quick plans judge within this margin of the
# best is planned with the MILP too, and the quickest fitting plan wins (``_runners_up``).
RUNNER_UP_MARGIN = 0.05
# ... and at most this many such settings where memory binds, the MILP's time limit shared
# evenly between them and the best: with the k between the powers of two tried, several come
# that close (qwen_val at 32 devices: k=6, 4 and 8 within the margin of k=7 as the quick plans
# judge, and the MILP's plan at k=8 the quickest, as quick with a share of the time limit as
# with all of it). Where k = 1 fits, one: each round also polishes and places its candidates,
# which takes seconds at 1,024 devices x 50 tasks, where more rounds gain nothing.
RUNNERS_UP = 3
AS_PLACED_NOTE = "baselines reported as placed, devices not renamed"


def _make(name: str, problem: Problem) -> Schedule:
    return paper_schedule(problem) if name == "paper" else BASELINES[name](problem)


_JUDGES = {
    "default": Judge(("paper", *BASELINES), _make),
    **{name: Judge((name,), _make) for name in BASELINES},
}


def _quick(scheduler: str) -> Judge:
    """What the lever search judges a setting by: the schedules ``scheduler`` would consider,
    less the MILP (the paper's plan stands in for it; the final round runs it)."""
    return _JUDGES.get(scheduler, Judge(("paper",), _make))


def _check_levers(micro_batches: int | None, zero_stage: int | None) -> None:
    if micro_batches is not None and (
        isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1
    ):
        raise PlanError(f"micro_batches must be a whole number, at least 1; got {micro_batches!r}")
    if zero_stage is not None and zero_stage not in (0, 1, 2):
        raise PlanError(f"zero_stage must be 0, 1 or 2, got {zero_stage!r}")


@dataclass(frozen=True)
class _Call:
    """One ``make_plan`` call's settings, as each of its steps reads them."""

    graph: MetaGraph
    cost: CostModel
    scheduler: str
    budget: Budget
    check_memory: bool
    choice: SolverChoice
    passes: PassOptions

    @property
    def round_limit_s(self) -> float:
        """The MILP's time in one round (``ROUND_SHARE``)."""
        return min(ROUND_LIMIT_S, ROUND_SHARE * self.budget.seconds)

    def round(self, ctx: PlanContext, limit_s: float, search: LeverSearch | None = None) -> Round:
        """One round of ``scheduler`` under ``ctx``'s levers (``rounds.plan_round``), to end
        with the call's budget; ``search``: the lever search, whose placements tell which
        baselines the round need not place (``_known``)."""
        return plan_round(
            ctx,
            self.scheduler,
            limit_s,
            self.check_memory,
            self.choice,
            self.passes,
            deadline=self.budget.end - FINISH_S,
            known=_known(search),
        )


def _known(search: LeverSearch | None) -> dict[str, float]:
    """Each baseline's quickest fitting plan among the settings ``search`` placed it at
    (``plan_round``'s ``known``): what the plan reports for it is never slower."""
    placed = {name: search.quickest_placed(name) for name in BASELINES} if search else {}
    return {name: p[0].iteration_s for name, p in placed.items() if p is not None}


@dataclass(frozen=True)
class _Rounds:
    """What the rounds found: the pick and its context, every candidate of its round, the
    baselines tuned with their own levers, a bound taken meanwhile, and the notes of the
    runner-up settings."""

    ctx: PlanContext
    evaluated: dict[str, Evaluated]
    chosen: Evaluated
    tuned: dict[str, tuple[Evaluated, PlanContext]]
    early: Bound | None
    notes: tuple[str, ...]
    # the baselines the time budget left untuned: each one's quickest fitting plan among
    # the settings the plan's search placed it at, as placed (None: none fits)
    untuned: dict[str, tuple[Evaluated, PlanContext] | None] = field(default_factory=dict)


def make_plan(
    graph: MetaGraph,
    cost: CostModel,
    *,
    scheduler: str = "default",
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    check_memory: bool = True,
    solver: str | None = None,
    micro_batches: int | None = None,
    zero_stage: int | None = None,
    passes: PassOptions = ALL_PASSES,
    jobs: int | None = None,
    started_at: float | None = None,
) -> Plan:
    """Plan one training iteration of ``graph`` (see the module docstring for schedulers).

    ``time_limit_s`` is the whole call's time (``DEFAULT_TIME_LIMIT_S`` says how it is
    spent): past what a plan needs, the search returns the best found when it runs out.
    Raises ``PlanError`` for an unknown scheduler or when no setting of the memory
    levers makes a plan fit in device memory (the error names the MetaOp, the device, the
    bytes, the levers at their limit and how many devices it would take).
    ``micro_batches`` / ``zero_stage`` force that lever (None: the planner chooses; k passes
    of the waves per iteration, ZeRO stage 0, 1 or 2).
    ``check_memory=False`` returns the plan anyway, with k = 1 and ZeRO-1 unless forced and
    no recompute, with notes saying where it does not fit (``validate_plan`` still reports
    the overflow): for comparing schedules under a cost model whose memory figures are known
    to be pessimistic.
    ``solver``: the MILP solver, "highs" or "cbc" (default: ``$SPINDLE_SOLVER``, else HiGHS;
    see ``planner.solver.choice``). ``passes``: the ``milp`` scheduler's passes to run (all by
    default; ``bench/plan_quality.py --ablation`` switches each off in turn). ``jobs``: helper
    processes planning the runner-up settings' rounds beside this one (``helpers``;
    default: one per spare core, up to ``RUNNERS_UP``; 0: none). ``started_at``
    (``time.perf_counter``, default now): when the budget started, for a caller whose own
    work before planning counts (the CLI's start-up).
    The plan's ``lower_bound_s`` and ``extra["bounds"]``: see ``Bound``.
    """
    if scheduler not in SCHEDULERS:
        raise PlanError(f"unknown scheduler '{scheduler}' (choose from {', '.join(SCHEDULERS)})")
    _check_levers(micro_batches, zero_stage)
    budget = Budget(time.perf_counter() if started_at is None else started_at, time_limit_s)
    call = _Call(graph, cost, scheduler, budget, check_memory, choose_solver(solver), passes)
    helpers, kinds = _helpers(call, jobs)
    if call.choice.isolated:  # the solver process too, once the helpers are up (``warm_up``)
        warm_up(after=helpers)
    search, fit, ctx = _search_levers(call, micro_batches, zero_stage, helpers[:1], kinds)
    planned_more = scheduler in ("default", "milp") and budget.within(SEARCH_SHARE)
    rivals = _runners_up(fit, ctx) if planned_more else ()
    found = _plan_rounds(call, search, fit, ctx, rivals, helpers, kinds)
    pick = _final_pick(call, found)
    ctx, chosen, ranked = pick.ctx, pick.chosen, pick.ranked
    notes = _notes(scheduler, chosen, ranked, {k: ranked[k].iteration_s for k in BASELINES})
    notes += tuple(
        n for n in chosen.schedule.notes if n.startswith((RENAME_NOTE, SPREAD_LOSS_NOTE))
    )
    notes += found.notes + pick.notes + _idle_workers_note(ctx, chosen)
    if search is not None:
        asked = tuple(
            f"{flag} {value}"
            for flag, value in (("--micro-batches", micro_batches), ("--zero-stage", zero_stage))
            if value is not None
        )
        notes += _lever_notes(ctx, fit, pick.tuned, asked)
    if not chosen.fits:
        notes += ("memory check off: " + overflow_message(ctx, chosen),)
    # the bound taken beside the helper's round holds where it bounded the plan's k (it may
    # also bound the own round's k, where a plan fits that the memory room alone rules out)
    early = found.early
    fits_k = early is not None and ctx.levers.micro_batches in early.ks
    bound = early if early is not None and fits_k else _lower_bound(ctx, search, call.choice)
    if bound.note:
        notes += (bound.note,)
    return to_plan(
        ctx,
        chosen,
        lower_bound_s=bound.seconds,
        baselines={k: ranked[k].iteration_s for k in BASELINES},
        wall_s=budget.spent(),
        notes=notes,
        extra=_extra(call, ctx, chosen, ranked, pick.tuned, bound),
    )


def _helpers(call: _Call, jobs: int | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The helper processes that plan runner-up rounds (``helpers``), started now so
    that they come up while the lever search runs, and the modules registering the graph's
    kinds, for them to import."""
    if not (has_rounds(call.scheduler, call.check_memory) and has_slice_memory(call.cost)):
        return (), ()
    count = helper_count(jobs, RUNNERS_UP)
    found = kind_modules(call.graph) if count else None
    if found is None:
        return (), ()
    return start_helpers(count), found


def _search_levers(
    call: _Call,
    micro_batches: int | None,
    zero_stage: int | None,
    helper: tuple[str, ...] = (),
    kinds: tuple[str, ...] = (),
) -> tuple[LeverSearch | None, Fit, PlanContext]:
    """The memory levers' search judged by the quick plans (``leversearch``), and the
    context of its best setting; without memory to check, k = 1 and ZeRO-1 unless forced.
    ``helper``: the channel of a helper to judge its second setting, if any."""
    if not (call.check_memory and has_slice_memory(call.cost)):
        stage = 1 if zero_stage is None else zero_stage
        levers = Levers(micro_batches or 1, stage)
        return None, Fit(), context(call.graph, call.cost, levers, enforce=False)
    search = LeverSearch(
        call.graph,
        call.cost,
        micro_batches=micro_batches,
        zero_stage=zero_stage,
        budget=call.budget,
        helper=helper[0] if helper else None,
        kind_modules=kinds,
    )
    fit = search.search(_quick(call.scheduler))
    if fit.best is None or fit.best.ctx is None:
        raise PlanError(no_fit_message(search, fit))
    return search, fit, fit.best.ctx


def _own_round(
    call: _Call, search: LeverSearch | None, fit: Fit, ctx: PlanContext, limit_s: float
) -> tuple[PlanContext, dict[str, Evaluated], Evaluated]:
    """The round at the search's best setting; where its pick overflows memory, the search's
    next setting (more recompute) and another round, until one fits or none is left."""
    trial = fit.best
    evaluated, chosen = call.round(ctx, limit_s, search)
    while search is not None and trial is not None and not chosen.fits:
        nxt = search.step(trial, chosen)  # the MILP's pick may still overflow
        if nxt is None:
            break
        trial = search.trial(nxt, _quick(call.scheduler))
        if trial.ctx is None:
            break
        ctx = trial.ctx
        fit.reasons.append(f"the {chosen.schedule.name} plan overflowed")
        evaluated, chosen = call.round(ctx, limit_s, search)
    if not chosen.fits and call.check_memory:
        raise PlanError(overflow_message(ctx, chosen))
    return ctx, evaluated, chosen


def _plan_rounds(
    call: _Call,
    search: LeverSearch | None,
    fit: Fit,
    ctx: PlanContext,
    rivals: tuple[Trial, ...],
    helpers: tuple[str, ...],
    kinds: tuple[str, ...],
) -> _Rounds:
    """The search's best setting planned here and the runner-up settings in the helpers,
    side by side, sharing the time limit (``RUNNER_UP_MARGIN``); the baselines are tuned and
    a bound taken meanwhile (by a helper, beside the round, where there is no runner-up).
    The quickest fitting pick wins."""
    limit = call.round_limit_s / (1 + len(rivals))

    def rival_here(i: int) -> Round:
        rival_ctx = rivals[i].ctx
        assert rival_ctx is not None
        return call.round(rival_ctx, limit)

    tuned: dict[str, tuple[Evaluated, PlanContext]] = {}
    untuned: dict[str, tuple[Evaluated, PlanContext] | None] = {}
    early: list[Bound] = []

    def meanwhile(mine: tuple[PlanContext, dict[str, Evaluated], Evaluated]) -> None:
        got, skipped = _tuned_baselines(search)
        tuned.update(got)
        untuned.update(skipped)
        if helpers and rivals:
            early.append(_lower_bound(mine[0], search, call.choice))

    def own() -> tuple[PlanContext, dict[str, Evaluated], Evaluated]:
        return _own_round(call, search, fit, ctx, limit)

    rival_rounds: list[Round] = []
    if rivals or not helpers or search is None:
        requests = _round_requests(call, rivals, limit, kinds)
        busy = helpers if rivals else ()
        mine, rival_rounds = side_by_side(
            own, requests, rival_here, busy, remote_round, limit, meanwhile=meanwhile
        )
    else:  # no runner-up for the helpers: one takes the lower bound beside the round
        start = ctx
        explored = tuple(search.explored)
        request = BoundRequest(
            call.graph,
            call.cost,
            ctx.levers,
            search.stages,
            explored,
            call.choice,
            kinds,
            search.pricing.priced_only(),
        )
        mine, got = side_by_side(
            own,
            [request],
            lambda _i: _lower_bound(start, search, call.choice),
            helpers,
            remote_bound,
            limit,
            meanwhile=meanwhile,
        )
        early.extend(got)
    ctx, evaluated, chosen = mine
    # (the overflow loop only adds recompute: the plan's k is still none of the rivals')
    own_ctx, own_pick = ctx, chosen
    best_s = fit.best.time_s if fit.best is not None else 0.0  # (rivals exist only with it)
    picks = []
    for rival, (rival_evaluated, pick) in zip(rivals, rival_rounds, strict=True):
        assert rival.ctx is not None
        picks.append((rival, pick))
        if pick.fits and pick.iteration_s < chosen.iteration_s * (1 - 1e-9):
            evaluated, chosen, ctx = rival_evaluated, pick, rival.ctx
    notes = tuple(
        _runner_up_note(own_ctx, own_pick, rival, best_s, pick, pick is chosen)
        for rival, pick in picks
    )
    bound = early[0] if early else None
    return _Rounds(ctx, evaluated, chosen, tuned, bound, notes, untuned)


def _round_requests(
    call: _Call, rivals: tuple[Trial, ...], limit: float, kinds: tuple[str, ...]
) -> list[RoundRequest]:
    """The runner-up settings' rounds as a helper runs them (``rounds.remote_round``)."""
    return [
        RoundRequest(
            call.graph,
            call.cost,
            r.levers,
            call.scheduler,
            limit,
            call.check_memory,
            call.choice,
            call.passes,
            kinds,
            tuple(r.ctx.evaluated.values()) if r.ctx is not None else (),
        )
        for r in rivals
    ]


@dataclass(frozen=True)
class BoundRequest:
    """The lower bound at the lever search's best setting as a helper takes it (picklable):
    the search's ZeRO stages and the k it explored are all the bound reads of it."""

    graph: MetaGraph
    cost: CostModel
    levers: Levers
    stages: tuple[int, ...]
    explored: tuple[int, ...]
    solver: SolverChoice
    kind_modules: tuple[str, ...] = ()
    # what the search priced (``PricingCache.priced_only``): the helper prices only the
    # settings the bound adds (at 1,024 H100s x 48 tasks the bound then takes 2.6-2.9 s,
    # against 3.4-4.8 s from scratch)
    pricing: PricingCache | None = None


def remote_bound(request: BoundRequest) -> tuple[Bound, Caught] | None:
    """``_lower_bound`` of ``request`` in a helper process (``helpers.answer``): the search's
    pricing and its context at the levers are rebuilt there (memos only), its LPs solved
    there (``helpers.solving_here``)."""
    r = request

    def work() -> Bound:  # (after the kinds' modules are imported)
        search = LeverSearch(r.graph, r.cost)
        if r.pricing is not None and r.pricing.graph is r.graph:  # (sent together)
            search.pricing = r.pricing
        search.stages, search.explored = r.stages, list(r.explored)
        ctx = search.context(r.levers)  # (the caller's search placed plans there)
        assert not isinstance(ctx, PlanError)
        return _lower_bound(ctx, search, solving_here(r.solver))

    return answer(r.kind_modules, work)


@dataclass(frozen=True)
class _Pick:
    """The plan's pick and its context, every candidate as the plan reports it, each
    baseline's best with its context, and the notes the pick adds."""

    ctx: PlanContext
    chosen: Evaluated
    ranked: dict[str, Evaluated]
    tuned: dict[str, tuple[Evaluated, PlanContext]]
    notes: tuple[str, ...]


def _final_pick(call: _Call, found: _Rounds) -> _Pick:
    """Every candidate as the plan reports it, each baseline at its best levers (its own
    tuned ones or the plan's, ``_at_plan_levers``), and, for the ``default`` scheduler, the
    pick among them: a baseline tuned with other levers may be quicker still (then the MILP
    plans again with its levers: it may find concurrency that fits there too), and the
    sequential plan where the pick's gain is within the cost model's error
    (``_data_parallel_within_margin``)."""
    ctx, chosen = found.ctx, found.chosen
    ranked = {**found.evaluated, **{k: ev for k, (ev, _) in found.tuned.items()}}
    if call.scheduler == "default":
        best = min(found.tuned.values(), key=lambda t: t[0].iteration_s, default=None)
        if best is not None and best[0].iteration_s < chosen.iteration_s * (1 - 1e-9):
            chosen, ctx = best
            if call.budget.within(REPLAN_SHARE):
                _, pick = call.round(ctx, call.round_limit_s)
                if pick.fits and pick.iteration_s < chosen.iteration_s:
                    chosen = ranked[pick.schedule.name] = pick
    tuned = _at_plan_levers(ctx, found.tuned, found.evaluated if ctx is found.ctx else {})
    untuned, as_placed = _untuned_at_best(found, call.budget)
    tuned.update(untuned)
    notes: tuple[str, ...] = ()
    if found.untuned:
        names = ", ".join(found.untuned)
        notes += (f"time limit reached: {names} at the best levers the plan's search tried",)
    if as_placed:
        names = ", ".join(as_placed)
        notes += (f"{AS_PLACED_NOTE} (time limit): {names}",)
    if call.scheduler == "default":
        quickest = min(tuned.values(), key=lambda t: t[0].iteration_s, default=None)
        if quickest is not None and quickest[0].iteration_s < chosen.iteration_s * (1 - 1e-9):
            chosen, ctx = quickest  # a baseline under the plan's levers, spread
        before = ctx
        chosen, ctx, kept = _data_parallel_within_margin(call.cost, chosen, ctx, tuned)
        notes += kept
        if ctx is not before:
            tuned = _at_plan_levers(ctx, tuned, {})
    ranked.update({k: t[0] for k, t in tuned.items() if t is not found.tuned.get(k)})
    return _Pick(ctx, chosen, ranked, tuned, notes)


def _untuned_at_best(
    found: _Rounds, budget: Budget
) -> tuple[dict[str, tuple[Evaluated, PlanContext]], tuple[str, ...]]:
    """Each baseline the time budget left untuned at the quicker (as placed) of its best
    setting the plan's search placed it at and the round's levers, then spread while
    ``REPLAN_SHARE`` of the budget is unspent (one renaming search each, the costly step at
    1,024 devices; past it, as placed); and the names of those left as placed."""
    out = {}
    as_placed = []
    for name, placed in found.untuned.items():
        here = found.evaluated.get(name)
        options = [placed] if placed is not None else []
        if here is not None and here.fits:
            options.append((here, found.ctx))
        if options:
            ev, ctx = min(options, key=lambda o: o[0].iteration_s)
            if budget.within(REPLAN_SHARE):
                ev = relabel_and_spread(ctx, ev)
            else:
                as_placed.append(name)
            out[name] = (ev, ctx)
    return out, tuple(as_placed)


def _at_plan_levers(
    ctx: PlanContext,
    tuned: dict[str, tuple[Evaluated, PlanContext]],
    placed: dict[str, Evaluated],
) -> dict[str, tuple[Evaluated, PlanContext]]:
    """``tuned`` with each baseline replaced by its plan under ``ctx``'s levers (the plan's
    own), devices renamed and losses spread, where that is quicker and fits: the lever search
    tunes a baseline over the micro-batch counts it explored first, which need not include
    the plan's, and a speed-up over a baseline must not be more than the speed-up over it
    run with the plan's own levers. ``placed``: the round's candidates under ``ctx``, where it
    was the round's (the baselines among them need not be placed again)."""
    out = dict(tuned)
    for name, (ev, own_ctx) in tuned.items():
        if own_ctx.levers == ctx.levers:
            continue
        plain = placed.get(name)
        if plain is None:
            sched = BASELINES[name](ctx.problem)
            if compute_floor(ctx, sched) >= ev.iteration_s:
                continue  # its compute alone reaches the tuned plan (as below): not placed
            plain = evaluate_cached(ctx, sched)
        # renaming devices and spreading losses leave the waves' compute and overheads as
        # they are: where those alone reach the tuned plan, neither can make it quicker; and
        # a plan that overflows is left out rather than spread in the hope that it then fits
        floor = plain.timing.compute_s + plain.timing.wave_overhead_s
        if not plain.fits or floor >= ev.iteration_s:
            continue
        here = relabel_and_spread(ctx, plain)
        if here.fits and here.iteration_s < ev.iteration_s * (1 - 1e-9):
            out[name] = (here, ctx)
    return out


def _extra(
    call: _Call,
    ctx: PlanContext,
    chosen: Evaluated,
    ranked: dict[str, Evaluated],
    tuned: dict[str, tuple[Evaluated, PlanContext]],
    bound: Bound,
) -> dict:
    """The plan's ``extra``: the scheduler, every candidate's iteration, the level reference,
    the pick's solver notes, each baseline's levers and how the bound was taken."""
    return {
        "scheduler": call.scheduler,
        "candidates_s": {k: e.iteration_s for k, e in ranked.items()},
        "level_reference_s": ctx.levers.micro_batches * level_reference_s(ctx.problem),
        "solver_notes": list(chosen.schedule.notes),
        "baseline_levers": {k: _levers_dict(bctx.levers) for k, (_, bctx) in tuned.items()},
        "baselines_overflow": sorted(k for k in BASELINES if k in ranked and not ranked[k].fits),
        "bounds": bound.record(),
    }


def _runners_up(fit: Fit, ctx: PlanContext) -> tuple[Trial, ...]:
    """The settings the MILP plans besides ``ctx``'s: where the search refined k, the best
    over the powers of two first (the quick plans can misjudge the refined pick: on qwen_val
    audio_heavy at 64 devices they put k=3 ahead of k=4, and the MILP's plan at k=4 is the
    quicker), then the quickest fitting settings at other k that the quick plans judge
    within ``RUNNER_UP_MARGIN`` of the search's best; at most ``RUNNERS_UP`` where memory
    binds (``Fit.memory_binds``), else one."""
    best = fit.best
    if best is None or best.fitting is None:
        return ()
    k = ctx.levers.micro_batches
    close = sorted(
        (
            t
            for kk, t in fit.per_k.items()
            if kk != k
            and t.ctx is not None
            and t.fitting is not None
            and t.time_s <= best.time_s * (1 + RUNNER_UP_MARGIN)
        ),
        key=lambda t: t.time_s,
    )
    coarse = fit.coarse
    if coarse is not None and coarse.fitting is not None and coarse.levers.micro_batches != k:
        close = [
            coarse,
            *(t for t in close if t.levers.micro_batches != coarse.levers.micro_batches),
        ]
    return tuple(close[: RUNNERS_UP if fit.memory_binds else 1])


def _runner_up_note(
    ctx: PlanContext, chosen: Evaluated, rival: Trial, best_s: float, pick: Evaluated, kept: bool
) -> str:
    """What planning the runner-up setting with the MILP found (``RUNNER_UP_MARGIN``);
    ``best_s``: the search's best setting as the quick plans judged it."""
    total = len(ctx.graph.metaops)
    mine, theirs = ctx.levers.describe(total), rival.levers.describe(total)
    behind = rival.time_s / best_s - 1
    head = (
        f"runner-up levers {theirs}, judged {behind:.1%} behind by the quick plans, planned too: "
    )
    if not pick.fits:
        return head + f"its plan does not fit in memory, so {mine} stays"
    verdict = "kept" if kept else "not kept"
    return head + (
        f"{pick.iteration_s:.4g} s against {chosen.iteration_s:.4g} s with {mine} ({verdict})"
    )


def _data_parallel_within_margin(
    cost: CostModel,
    chosen: Evaluated,
    ctx: PlanContext,
    tuned: dict[str, tuple[Evaluated, PlanContext]],
) -> tuple[Evaluated, PlanContext, tuple[str, ...]]:
    """The sequential plan (every MetaOp data parallel over all devices, the layout plain DDP
    runs) instead of ``chosen`` where ``chosen`` is predicted faster by less than the cost
    model's measured prediction error (``prediction_margin``): a gain the model cannot tell
    from its own error is not worth the exchanges and the uneven groups that buy it."""
    margin = float(getattr(cost, "prediction_margin", 0.0))
    sequential = tuned.get("sequential")
    if margin <= 0 or sequential is None or chosen.schedule.name == "sequential":
        return chosen, ctx, ()
    plain, plain_ctx = sequential
    if not plain.fits or chosen.iteration_s * (1 + margin) < plain.iteration_s:
        return chosen, ctx, ()
    gain = plain.iteration_s / chosen.iteration_s - 1
    note = (
        f"kept the sequential (data-parallel) plan: the '{chosen.schedule.name}' plan is "
        f"predicted {gain:.1%} faster, within the cost model's prediction error ({margin:.0%})"
    )
    return plain, plain_ctx, (note,)


def _tuned_baselines(
    search: LeverSearch | None,
) -> tuple[
    dict[str, tuple[Evaluated, PlanContext]], dict[str, tuple[Evaluated, PlanContext] | None]
]:
    """Each baseline planned with its own best setting of the memory levers, its loss phase
    spread as the planner's own plans are (``planner.evaluate.relabel``). Once
    ``TUNE_SHARE`` of the time budget is spent, the rest get no search of their own: each
    is its quickest fitting plan among the settings the plan's search placed it at, as
    placed, in the second item (``_untuned_at_best``)."""
    out: dict[str, tuple[Evaluated, PlanContext]] = {}
    if search is None:
        return out, {}
    untuned = {}
    for name in BASELINES:
        if not search.budget.within(TUNE_SHARE):
            untuned[name] = search.quickest_placed(name)
            continue
        best = search.search(_quick(name), tuple(search.explored), TUNE_SHARE).best
        if best is not None and best.ctx is not None and best.fitting is not None:
            out[name] = (relabel_and_spread(best.ctx, best.fitting), best.ctx)
    return out, untuned


@dataclass(frozen=True)
class Bound:
    """The plan's lower bound and how it was taken (``extra["bounds"]``).

    ``seconds`` is the LP bound (``lp_bound``) over the micro-batch counts the planner
    tried: the least over k of k times the LP of one pass's curves at k plus the floors of the
    step terms the LP does not count (``step_floor``: loss phase, optimizer, closing
    all-reduce; ``_lower_bound``), proven below every plan the planner could have made with
    those k. ``record`` holds the least of the LP alone (``lp_s``, a bound on the compute;
    None if an LP that mattered failed), the floors added at the k that sets the bound
    (``step_floor_s``), the area / critical-path bound taken the same way (``area_path_s``),
    the LPs' solving time (``lp_wall_s``) and the k bounded (``micro_batches``).
    """

    seconds: float
    lp_s: float | None  # None when an LP that could have set the bound was not solved
    area_path_s: float
    lp_wall_s: float
    ks: tuple[int, ...]  # the micro-batch counts bounded
    note: str | None = None
    step_floor_s: float = 0.0  # ``seconds`` less the LP alone, at the k that sets it
    lanes: int | None = None  # the cores the bound divides work by, where fewer than devices
    # the k that sets ``seconds`` and the floors in ``step_floor_s`` at it, term by term: k
    # loss phases, the optimizer, the closing all-reduce (the rest of ``step_floor_s`` is what
    # the LP weighing the optimizer's per-part work adds); what ``Plan.gap_split`` reads
    floor_k: int = 1
    floor_terms: tuple[tuple[str, float], ...] = ()

    def record(self) -> dict:
        """The plan's ``extra["bounds"]``."""
        return {
            "lp_s": self.lp_s,
            "area_path_s": self.area_path_s,
            "lp_wall_s": self.lp_wall_s,
            "micro_batches": list(self.ks),
            "step_floor_s": self.step_floor_s,
            **({"lanes": self.lanes} if self.lanes is not None else {}),
            "floors": {"micro_batches": self.floor_k, **dict(self.floor_terms)},
        }


def _lower_bound(ctx: PlanContext, search: LeverSearch | None, choice: SolverChoice) -> Bound:
    """A proven lower bound on the iteration time of any plan with the levers the planner
    considered: the least over the k tried of k times the LP bound of one pass at k
    (``lp_bound(problem, micro_batches=k)``) plus the floors of the step terms the LP does not
    count at k (``step_floor``: the loss phase, the optimizer, the closing all-reduce). At each
    k the pass problem is the envelope of every setting at that k: per MetaOp, the allocations
    the search's contexts at k offer it without recompute and with it, under every ZeRO stage
    tried (``memfit.memory_room``, ``memfit.offered_specs``: those on which one device holds it),
    at the least T(n) (``MemoryRoom.either``), so it holds whichever of them the plan pulled,
    and the memory room at k (``lp_bound`` module docstring, "Memory" and "One device") lets
    each MetaOp recompute where it frees bytes, on the allocations offered so, and asks that
    what the MetaOps keep fit in the cluster: a k at which not even recomputing everything
    fits, or some MetaOp is offered no allocation, is left out (the plan's own k never is:
    there the pass problem takes every allocation its curves list, memory aside). Without a
    lever search it is the plan's own problem at the plan's k. ``lp_s`` is the least over k
    of the LP alone (a bound on the compute). The LPs are solved in order of the area /
    critical-path bound, which is below each, and stop once that alone passes both best
    values: the least are the same, with fewer LPs solved."""
    problems, rooms = _bounded_passes(ctx, search)
    # where CPU workers share fewer cores, the cores bound the work done at once (the
    # context's problem carries them, ``build.context``; None: a core each)
    lanes = ctx.problem.lanes
    cheap = {k: k * area_path_bound_s(p, lanes) for k, p in problems.items()}
    each_floor = {k: step_floor(ctx.step, k) for k in problems}
    floors = {k: f.total_s(k) for k, f in each_floor.items()}
    best: LpBound | None = None  # the least LP alone
    best_total, total_k = float("inf"), min(problems)
    lp_at: dict[int, float] = {}
    wall = 0.0
    failed = False
    for k in sorted(cheap, key=cheap.__getitem__):
        if (
            best is not None
            and cheap[k] >= best.lower_bound_s
            and cheap[k] + floors[k] >= best_total
        ):
            break
        got = lp_relaxation_bound(problems[k], k, choice, memory=rooms.get(k), lanes=lanes)
        lp_at[k] = got.lower_bound_s
        wall += got.wall_s
        failed = failed or got.seconds is None
        if best is None or got.lower_bound_s < best.lower_bound_s:
            best = got
        total = got.lower_bound_s + floors[k]
        f = each_floor[k]
        if (f.holder_work or f.holder_groups) and got.seconds is not None:
            # the optimizer weighed in the LP too
            joint = lp_relaxation_bound(
                problems[k],
                k,
                choice,
                f.holder_work,
                rooms.get(k),
                lanes=lanes,
                holder_groups=f.holder_groups,
            )
            wall += joint.wall_s
            if joint.seconds is not None:
                total = max(total, joint.seconds + f.beside_lp_s(k))
        if total < best_total:
            best_total, total_k = total, k
    assert best is not None
    f = each_floor[total_k]
    return Bound(
        best_total,
        None if failed else best.seconds,
        min(cheap.values()),
        wall,
        tuple(sorted(problems)),
        best.note,
        best_total - lp_at[total_k],
        lanes,
        total_k,
        (
            ("loss_s", total_k * f.loss_s),
            ("optimizer_s", f.optimizer_s),
            ("closing_s", f.closing_s),
        ),
    )


def _bounded_passes(
    ctx: PlanContext, search: LeverSearch | None
) -> tuple[dict[int, Problem], dict[int, MemoryRoom | None]]:
    """Per micro-batch count k the lower bound covers, the pass problem whose LP bounds every
    setting at k, and the memory room the LP enforces there (None: it does not bind); see
    ``_lower_bound``."""
    if search is None:
        return {ctx.levers.micro_batches: ctx.problem}, {}
    problems: dict[int, Problem] = {}
    rooms: dict[int, MemoryRoom | None] = {}
    for k in sorted({*search.explored, ctx.levers.micro_batches}):
        room = memory_room(search, k)
        either = room.either(pass_problem(ctx.graph, ctx.cost, Levers(k), search.pricing))
        if either is not None and room.least_kept() <= room.room:
            problems[k] = either
            rooms[k] = room if room.binds() else None
        elif k == ctx.levers.micro_batches:  # the plan's own k, which fits: the room
            # and the allocations offered go unused rather than trusted
            problems[k] = pass_problem(ctx.graph, ctx.cost, Levers(k), search.pricing)
        # (at any other k no plan fits: it bounds nothing)
    return problems, rooms


def _levers_dict(levers: Levers) -> dict:
    return {
        "micro_batches": levers.micro_batches,
        "zero_stage": levers.zero_stage,
        "recompute": sorted(levers.recompute),
    }


def _lever_notes(
    ctx: PlanContext,
    fit: Fit,
    tuned: dict[str, tuple[Evaluated, PlanContext]],
    asked: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """Which memory levers the plan pulls and why (``asked``: the levers the caller fixed,
    e.g. ``("--zero-stage 0",)``); which the baselines pulled."""
    lv = ctx.levers
    total = len(ctx.graph.metaops)
    notes = []
    # replicated optimizer state is no memory lever but the want of one: the search takes it
    # where it fits and is quicker (``LeverSearch.search``, step 3)
    replicated = lv.zero_stage == 0 and "--zero-stage 0" not in asked
    if replicated:
        notes.append(
            "optimizer state replicated on every holder of a part (ZeRO-0): it fits, and the "
            "quick plans judge the step quicker than with it sharded (no all-gather of the "
            "weights after the update)"
        )
    sharded = lv.zero_stage != 1 and not replicated  # ZeRO-2, or a stage asked for
    if lv.micro_batches > 1 or lv.recompute or sharded:
        pulled = []
        if lv.micro_batches > 1:
            pulled.append(f"{lv.micro_batches} micro-batches per iteration")
        if sharded:
            pulled.append(f"ZeRO-{lv.zero_stage}")
        if lv.recompute:
            names = ", ".join(f"'{o.id}'" for o in ctx.graph.metaops if o.id in lv.recompute)
            pulled.append(
                f"activation recompute on {len(lv.recompute)} of {total} MetaOps ({names})"
            )
        why = "; ".join(dict.fromkeys(fit.reasons[:2]))
        plain = fit.per_k.get(1)
        for_speed = (
            lv.micro_batches > 1
            and not (lv.recompute or sharded)
            and not any(a.startswith("--micro-batches") for a in asked)
            and plain is not None
            and plain.fitting is not None
            and not plain.levers.recompute
            and plain.levers.zero_stage != 2
        )
        if not why and for_speed:
            # more passes kept for speed alone (smaller micro-batches scale to more devices)
            why = (
                f"not memory: k=1 fits too ({plain.time_s:.4g} s as the quick plans judge it), "
                f"but the plans with more passes are quicker"
            )
        if asked:
            why = "; ".join(x for x in (f"asked for ({', '.join(asked)})", why) if x)
        per_k = ", ".join(
            f"k={k} {t.time_s:.4g} s ({t.levers.describe(total).split(', ', 1)[1]})"
            if t.fitting is not None
            else f"k={k} none fits"
            for k, t in sorted(fit.per_k.items())
        )
        notes.append(
            f"memory levers: {', '.join(pulled)}. Why: {why or 'no plan fits without them'}. "
            f"Quickest fitting setting per number of micro-batches k, as the quick plans judge "
            f"it: {per_k}; recompute goes first where it frees the most kept-activation bytes "
            f"per second of extra forward"
        )
    if tuned:
        notes.append(
            "baselines tuned with the same levers: "
            + "; ".join(f"{k} {c.levers.describe(total)}" for k, (_, c) in tuned.items())
        )
    return tuple(notes)


def _notes(
    scheduler: str,
    chosen: Evaluated,
    evaluated: dict[str, Evaluated],
    baselines: dict[str, float],
) -> tuple[str, ...]:
    notes = []
    name = chosen.schedule.name
    if scheduler == "default":
        others = ", ".join(
            f"{k} {e.iteration_s:.4g} s{'' if e.fits else ' (does not fit in memory)'}"
            for k, e in evaluated.items()
            if k != name
        )
        notes.append(f"default scheduler kept '{name}' ({chosen.iteration_s:.4g} s); {others}")
    if chosen.iteration_s > baselines["sequential"] * (1 + 1e-9):
        notes.append(
            f"iteration_s exceeds sequential_s: the '{name}' plan was asked for explicitly"
            if scheduler != "default"
            else "iteration_s exceeds sequential_s: the sequential plan does not fit in memory"
        )
    return tuple(notes)


def _idle_workers_note(ctx: PlanContext, chosen: Evaluated) -> tuple[str, ...]:
    """Why a plan on shared cores leaves workers with nothing to run: a user who asked for 8
    workers and sees 2 busy should learn it is the cores, not a planner fault."""
    lanes = ctx.problem.lanes
    if lanes is None:
        return ()
    used = {d for wave in chosen.placement.waves for p in wave for d in p.devices}
    used.update(d for _, group in chosen.placement.loss_groups for d in group)
    idle = ctx.problem.devices - len(used)
    if idle <= 0:
        return ()
    workers = ctx.problem.devices
    return (
        f"{idle} of {workers} workers {'runs' if idle == 1 else 'run'} no MetaOp: the "
        f"{workers} workers share {lanes} core{'s' if lanes > 1 else ''}, and workers beyond "
        f"the cores only take turns on them (each wave is timed as "
        f"its work over the cores); fewer workers (spindle plan --devices, spindle train "
        f"--nproc) spare the idle processes",
    )


__all__ = ["DEFAULT_TIME_LIMIT_S", "SCHEDULERS", "make_plan"]
