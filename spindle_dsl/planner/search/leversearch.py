"""Choosing the memory levers: one search over micro-batches, ZeRO stage and activation
recompute, every setting judged by the same measure, the iteration time of the placed plans
that fit.

For a setting ``Levers(k, z, R)`` the planner builds a ``PlanContext`` (one pass's curves at
the micro-batch size, memory under stage z, allocations restricted to where each MetaOp fits)
and places a quick set of schedules in it (the ``Judge``: the paper's plan and the baselines
for the default scheduler). The search runs in three steps:

1. without recompute, for k = 1, 2, 4, ... (``levers.micro_batch_choices``): until k is so
   large that even its fastest plan is slower than the quickest fitting one found. A k past
   the first that fits is still tried, since more passes can be quicker without any memory
   pressure (smaller micro-batches scale to more devices: on qwen_val at 128 devices the
   MILP's plan at k=2 is quicker than at k=1, which fits); usually that next k is slower and
   ends it. Past the search's share of the time budget the next k is still tried while
   memory holds the plan back (``held_back``: the quickest plan at this k overflows and is
   far quicker than the quickest that fits), since more passes are what lets it fit: at
   1,024 devices x 48 tasks only the tasks side by side fit at k = 1 and 2, 2.4x slower than
   the paper's plan, which fits from k = 4. The search's share ends early where the time
   left would not hold ``ROUND_TRIALS`` of its slowest settings (the round that follows).
   On large jobs (``AHEAD_SIZE``) a helper judges the second k while this process judges
   the first (``send_ahead``), then the third while the helper is still at it
   (``_meanwhile``);
2. at every k tried whose fastest plan (fitting or not) is quicker than the best found, since
   recompute and ZeRO-2 only slow a pass down, for ZeRO-1 and ZeRO-2 (at k = 1 ZeRO-1 alone:
   one pass under ZeRO-2 prices the same, ``stages_at``), the recompute set R is fitted
   (``fit``): a prefix of the MetaOps in order of kept-activation bytes freed per
   device-second of extra forward (what the cluster-wide floor needs at the least, then as
   long as lets the fastest plan fit, or any plan if it never does), its length found by
   galloping and bisection with probes that place only the schedule they test, then
   trimmed; a second candidate adds recompute round by round only where the fastest plan
   overflows (``select_more``);
2b. where memory binds (no plan fits at k = 1 without recompute), the k between the powers
   of two (``LeverSearch.between``): up to ``REFINE_ROUNDS`` times, steps 1 and 2 at the
   whole midpoints between the best k and its nearest tried neighbours, as the iteration
   time is then far from smooth in k (how the micro-batches round, which other levers each k
   needs): on qwen_val at 16 devices k=8 needs ZeRO-2 and recompute, k=16 is slower, and
   k=13, with neither lever, is quicker than both;
3. at the best setting found, the optimizer state replicated instead (ZeRO-0): kept if it
   fits and is quicker (no all-gather of the weights after the update; every holder updates
   its whole parts), as for a small job on CPU ranks.

The quickest fitting plan of all wins, whatever lever made it fit. Each lever is priced where
it acts: k in the curves (smaller layers, per-pass overheads, the transfers of k passes, a
contrastive task's extra forward), z in the gradient traffic (ZeRO-2 reduce-scatters every
pass) and in memory, R in the recompute curves. Curves, allocations, settings and placements
are cached (``levers.PricingCache``, ``build.evaluate_cached``), so the baselines' own searches
(each baseline tuned with the same levers over the same k, for a like-for-like speed-up)
mostly reuse them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from spindle_dsl.cost.analytic import backward_multiplier
from spindle_dsl.cost.base import CostModel, Curves
from spindle_dsl.errors import PlanError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.planner.evaluate.build import (
    Evaluated,
    PlanContext,
    compute_floor,
    context,
    evaluate_cached,
    slice_memory_of,
)
from spindle_dsl.planner.model.levers import (
    UNLIMITED,
    Budget,
    Levers,
    PricingCache,
    micro_batch,
    micro_batch_choices,
    pass_curves,
)
from spindle_dsl.planner.model.problem import Problem, Schedule
from spindle_dsl.planner.search.helpers import Ahead, Caught, answer
from spindle_dsl.planner.search.memfit import MemoryFloor, gib, memory_floor

SLOWER = 1.0  # a k whose best is slower than the best so far ends the search
TRIM_TRIES = 8  # MetaOps the trim tries to stop recomputing, per fitted prefix
# rounds of recompute aimed at the overflowing devices (``select_more``), for judges of several
# schedules (a baseline alone, sequential above all, overflows evenly: the prefix serves it)
TARGETED_ROUNDS = 4
# bisection steps of the k bracket around the best power of two (``LeverSearch.between``)
REFINE_ROUNDS = 3
# Of the call's time budget (``levers.Budget``), what the search may have spent when a step
# past its first fitting setting starts: more k, recompute fitted at more k, the k between
# the powers of two, ZeRO-0. The rest goes to the round at the best setting.
SEARCH_SHARE = 0.4
# ... and while the budget has this many of its slowest trials left, for the round: it places
# and times about as many plans as that many settings' judges (at 1,024 H100s x 48 tasks a
# setting takes 1.1-1.8 s and the round 4.5-6 s; at 64 devices 50 ms and 0.26 s)
ROUND_TRIALS = 5
# Devices x MetaOps from which the first search's second k is judged by a helper beside its
# first (``send_ahead``): at 64 devices x 19 MetaOps a setting takes 50 ms, less than a helper
# takes to rebuild its context and send the plans back; at 1,024 x 190, 1.2-1.8 s
AHEAD_SIZE = 20_000
# how much quicker than the quickest fitting plan an overflowing one must be for the next k
# to be tried past ``SEARCH_SHARE`` (``held_back``)
HELD_BACK = 1.25


@dataclass(frozen=True)
class Judge:
    """The schedules a lever setting is judged by, each placed and timed in its context.

    What a trial reads of them is the quickest plan, the quickest that fits and the one
    closest to fitting (``Trial``): once a judged plan fits, a schedule whose compute alone
    (``compute_floor``) is no quicker than it can change none of the three, so it is not
    placed. They are judged least compute first, so that the first to fit rules out the most:
    at 1,024 devices x 48 tasks a setting is judged by one or two placements instead of four,
    the ones that decide it. A baseline judged so is placed by its own tuning where that needs it
    (``evaluate_cached``)."""

    names: tuple[str, ...]
    make: Callable[[str, Problem], Schedule]  # schedule name -> its schedule of a problem

    def __call__(self, ctx: PlanContext, names: tuple[str, ...] | None = None) -> list[Evaluated]:
        out: list[Evaluated] = []
        scheds = [self.make(name, ctx.problem) for name in names or self.names]
        floors = [compute_floor(ctx, s) for s in scheds]
        # the least compute first, so that the first plan to fit rules out the most (the
        # floors are k passes of it; without a step model they are 0, and compute orders)
        rank = floors if ctx.step is not None else [s.compute_s(ctx.problem) for s in scheds]
        for i in sorted(range(len(scheds)), key=rank.__getitem__):
            sched = scheds[i]
            fits = [e.iteration_s for e in out if e.fits]
            if fits and sched.waves not in ctx.evaluated and floors[i] >= min(fits) * (1 + 1e-9):
                continue
            out.append(evaluate_cached(ctx, sched))
        return out


@dataclass(frozen=True)
class Candidate:
    """A MetaOp that could recompute, with what it would free and cost (one pass)."""

    op: str
    freed: int  # bytes of kept activations one pass would no longer keep
    extra_s: float  # device-seconds of its extra forward passes (all layers, one pass)

    @property
    def efficiency(self) -> float:
        return self.freed / self.extra_s


def candidates(graph: MetaGraph, curves: Curves, floor: MemoryFloor) -> tuple[Candidate, ...]:
    """MetaOps with a backward pass that recompute would shrink, most efficient first.

    ``graph`` is a pass's micro-batch view and ``curves`` its pass curves without recompute.
    Recompute adds one forward to a layer whose forward and backward cost
    ``backward_multiplier`` forwards, so its extra device-seconds are read off the op's own
    curve at its smallest allocation (a profiled model ranks by measured times).
    """
    out = []
    for op in graph.metaops:
        freed = floor.kept[op.id] - floor.kept_recompute[op.id]
        if not op.needs_backward or freed <= 0:
            continue
        c = curves[op.id]
        n = c.ns[0]
        extra = op.layers * n * c.at(n) / backward_multiplier(op)
        out.append(Candidate(op.id, freed, max(extra, 1e-12)))
    return tuple(sorted(out, key=lambda c: (-c.efficiency, c.op)))


def select_more(ctx: PlanContext, ev: Evaluated, cands: tuple[Candidate, ...]) -> tuple[str, ...]:
    """The most efficient MetaOps, not yet recomputing, whose recompute would relieve the
    devices ``ev`` overflows, until their estimated savings cover every excess."""
    cap = ctx.topology.capacity
    excess = {d: m - cap for d, m in enumerate(ev.placement.memory) if m > cap}
    pieces: dict[str, list] = {}
    for wave in ev.placement.waves:
        for p in wave:
            pieces.setdefault(p.op, []).append(p)
    chosen: list[str] = []
    graph = ctx.pass_graph
    for c in cands:
        if c.op in ctx.recompute or not any(
            excess.get(d, 0) > 0 for p in pieces.get(c.op, ()) for d in p.devices
        ):
            continue
        op = graph.op(c.op)
        more = replace(ctx.levers, recompute=ctx.recompute | {c.op})
        saving: dict[int, float] = {}
        for p in pieces[c.op]:
            plain = ctx.slice_memory(p.op, p.n, p.first, p.end)
            rc = slice_memory_of(ctx.cost, graph, op, p.n, p.first, p.end, more)
            s = plain.kept + plain.working - rc.kept - rc.working
            for d in p.devices:
                saving[d] = saving.get(d, 0.0) + s
        if not any(v > 0 and excess.get(d, 0) > 0 for d, v in saving.items()):
            continue
        chosen.append(c.op)
        for d, v in saving.items():
            if d in excess:
                excess[d] -= v
        if all(v <= 0 for v in excess.values()):
            break
    return tuple(chosen)


@dataclass(frozen=True)
class Trial:
    """One lever setting as the judge saw it (``ctx`` None: some layer fits nowhere)."""

    levers: Levers
    ctx: PlanContext | None
    judged: tuple[Evaluated, ...] = ()
    error: PlanError | None = None

    @property
    def fitting(self) -> Evaluated | None:
        """The fastest judged plan that fits, if any."""
        fits = [e for e in self.judged if e.fits]
        return min(fits, key=lambda e: e.iteration_s) if fits else None

    @property
    def fastest(self) -> Evaluated | None:
        return min(self.judged, key=lambda e: e.iteration_s) if self.judged else None

    def least_over(self) -> Evaluated | None:
        """The judged plan closest to fitting (memory overflow, then time)."""
        if not self.judged or self.ctx is None:
            return None
        cap = self.ctx.topology.capacity
        return min(self.judged, key=lambda e: e.key(cap))

    @property
    def time_s(self) -> float:
        f = self.fitting
        return f.iteration_s if f is not None else float("inf")


@dataclass
class Fit:
    """Where a search stands: the best trial so far and why its levers are on."""

    best: Trial | None = None
    last: Trial | None = None  # the closest to fitting when nothing fits
    reasons: list[str] = field(default_factory=list)
    per_k: dict[int, Trial] = field(default_factory=dict)  # the quickest trial at each k
    # no plan fits at k = 1 without recompute: each k then needs its own share of the other
    # levers, which makes the iteration time bumpy in k (where the search refines k)
    memory_binds: bool = False
    coarse: Trial | None = None  # the best over the powers of two alone, where k was refined

    def record(self, k: int, t: Trial) -> None:
        """Keep ``t`` as k's trial if it fits quicker (or nothing at k fits yet)."""
        old = self.per_k.get(k)
        if old is None or (t.fitting is not None and t.time_s < old.time_s):
            self.per_k[k] = t


class LeverSearch:
    """The search of the module docstring over one graph and cost model.

    ``micro_batches`` / ``zero_stage`` force that lever (None: the search chooses).
    ``budget``: the planning call's time; once a setting fits, the steps that look for a
    quicker one start only while ``SEARCH_SHARE`` of it is unspent (``search``).
    """

    def __init__(
        self,
        graph: MetaGraph,
        cost: CostModel,
        *,
        micro_batches: int | None = None,
        zero_stage: int | None = None,
        budget: Budget = UNLIMITED,
        helper: str | None = None,
        kind_modules: tuple[str, ...] = (),
    ):
        self.graph, self.cost, self.budget = graph, cost, budget
        # a helper's channel, for the second setting (``search``), and the modules that
        # register the graph's kinds, for it to import
        self.helper, self.kind_modules = helper, kind_modules
        self._ahead: dict[Levers, Ahead] = {}
        self.slowest = 0.0  # seconds of the slowest trial so far (``search``)
        self.ks = (micro_batches,) if micro_batches else micro_batch_choices(graph)
        self.stages = (zero_stage,) if zero_stage is not None else (1, 2)
        self.replicate = zero_stage is None  # try ZeRO-0 once the best setting is known
        self.pricing = PricingCache(graph)
        self._contexts: dict[Levers, PlanContext | PlanError] = {}
        self._floors: dict[int, MemoryFloor] = {}
        self._cands: dict[int, tuple[Candidate, ...]] = {}
        self.explored: list[int] = []  # the k values the first search tried, in order

    # --- cached pieces ------------------------------------------------------------------------
    def context(self, levers: Levers) -> PlanContext | PlanError:
        if levers not in self._contexts:
            try:
                self._contexts[levers] = context(
                    self.graph,
                    self.cost,
                    levers,
                    enforce=True,
                    cache=self.pricing,
                )
            except PlanError as exc:
                self._contexts[levers] = exc
        return self._contexts[levers]

    def quickest_placed(self, name: str) -> tuple[Evaluated, PlanContext] | None:
        """The quickest fitting plan of schedule ``name`` among every setting the search has
        placed it at, with its context: a baseline's best levers as far as the plan's own
        search tried them, without a search of its own."""
        best: tuple[Evaluated, PlanContext] | None = None
        for ctx in self._contexts.values():
            if isinstance(ctx, PlanError):
                continue
            for ev in ctx.evaluated.values():
                if ev.schedule.name != name or not ev.fits:
                    continue
                if best is None or ev.iteration_s < best[0].iteration_s:
                    best = (ev, ctx)
        return best

    def floor(self, k: int) -> MemoryFloor:
        if k not in self._floors:
            self._floors[k] = memory_floor(self.pricing.view(k), self.cost)
        return self._floors[k]

    def candidates(self, k: int) -> tuple[Candidate, ...]:
        if k not in self._cands:
            curves = pass_curves(self.graph, self.cost, Levers(k), self.pricing)
            self._cands[k] = candidates(self.pricing.view(k), curves, self.floor(k))
        return self._cands[k]

    def trial(self, levers: Levers, judge: Judge, names: tuple[str, ...] | None = None) -> Trial:
        """``levers`` judged by ``names`` of the judge's schedules (all by default; the
        contexts memoise placements, so judging again is cheap; a setting sent ahead to a
        helper is judged there, ``send_ahead``)."""
        began = time.perf_counter()
        sent = self._ahead.pop(levers, None)
        judged = sent.take() if sent is not None else None
        if judged is not None and levers not in self._contexts:
            self._contexts[levers] = self.adopt(judged)
        ctx = self.context(levers)
        if isinstance(ctx, PlanError):
            return Trial(levers, None, error=ctx)
        trial = Trial(levers, ctx, tuple(judge(ctx, names)))
        self.slowest = max(self.slowest, time.perf_counter() - began)
        return trial

    def adopt(self, ctx: PlanContext) -> PlanContext:
        """A context a helper built and judged (``remote_trial``) as this search's own: its
        curves, problem and placed plans kept, its graphs and cost model this process's (equal
        to the helper's), and its memos merged into those this search's contexts share. At
        1,024 H100s x 48 tasks the context takes 0.6-0.9 s to build and 30 ms to send back."""
        k = ctx.levers.micro_batches
        shared = self.pricing
        shared.slices.update(ctx.memo)
        shared.moves.update(ctx.moves)
        shared.reductions.update(ctx.reductions)
        return replace(
            ctx,
            graph=self.graph,
            cost=self.cost,
            micro=None if ctx.micro is None else shared.view(k),
            memo=shared.slices,
            moves=shared.moves,
            reductions=shared.reductions,
        )

    def send_ahead(self, levers: Levers, judge: Judge) -> None:
        """Have the helper judge ``levers`` while this process judges another setting: the
        first search's second k, which it tries past any k = 1 that fits (step 1). At 1,024
        H100s x 48 tasks a setting takes 1.2-1.8 s, the helper's otherwise idle until the
        round; where the helper is not up before this process reaches the setting, it
        judges it itself."""
        if self.helper is None or levers in self._ahead:
            return
        request = TrialRequest(self.graph, self.cost, levers, judge, self.kind_modules)
        limit = self.budget.seconds if math.isfinite(self.budget.seconds) else 0.0
        self._ahead[levers] = Ahead(self.helper, remote_trial, request, limit)

    def _meanwhile(self, judge: Judge, k: int, following: tuple[int, ...]) -> None:
        """While the helper is still judging ``k``'s setting (``send_ahead``), the setting of
        the k ``following`` it judged here, rather than waiting: its context and placements
        are memoised, so judging it when the search gets there costs next to nothing. At
        1,024 H100s x 48 tasks the helper, started with the call, answers k = 2 1.5 s after
        this process has judged k = 1, and the search goes on to k = 4."""
        sent = self._ahead.get(Levers(k, self.stages[0]))
        if sent is not None and following and sent.busy():
            self.trial(Levers(following[0], self.stages[0]), judge)

    # --- the search -----------------------------------------------------------------------------
    def start(self, k: int) -> tuple[int, str | None]:
        """How many of the most efficient candidates must recompute for the cluster-wide
        floor at k to fit (0 when it fits without), and the reason if any must."""
        floor = self.floor(k)
        c = self.graph.cluster
        limit = c.devices * c.device.memory_bytes
        if floor.total(()) <= limit:
            return 0, None
        chosen: list[str] = []
        for cand in self.candidates(k):
            if floor.total(chosen) <= limit:
                break
            chosen.append(cand.op)
        why = (
            f"at k={k} the MetaOps need at least {gib(floor.total(()))} in all, and "
            f"{c.devices} x {c.device.name} hold {gib(limit)}"
        )
        return len(chosen), why

    def step(self, trial: Trial, target: Evaluated) -> Levers | None:
        """More recompute after ``target`` (a plan judged under ``trial``) overflowed."""
        assert trial.ctx is not None
        more = select_more(trial.ctx, target, self.candidates(trial.levers.micro_batches))
        if not more:
            return None
        return replace(trial.levers, recompute=trial.levers.recompute | set(more))

    def fit(self, judge: Judge, k: int, z: int, out: Fit) -> Trial | None:
        """Step 1 at one (k, z): the recompute set, a prefix of the candidates in order of
        efficiency, as short as lets the fastest judged plan fit (or the one closest to
        fitting, if that never does). The prefix length is found by galloping from a guess
        then bisection, each probe placing only the schedule it tests; then the prefix is
        trimmed (a MetaOp whose recompute costs the most dropped while the plan still fits
        and gets quicker), since the efficiency order is cluster-wide and the overflow may be
        local. The quickest fitting plan seen (every schedule judged) wins."""
        cands = self.candidates(k)
        order = [c.op for c in cands]
        extra_of = {c.op: c.extra_s for c in cands}
        lo, why = self.start(k)
        if why:
            out.reasons.append(why)
        forced: set[str] = set()  # MetaOps one of whose layers fits nowhere without recompute

        def probe(rc: frozenset[str], names: tuple[str, ...] | None) -> Trial:
            while True:
                t = self.trial(Levers(k, z, rc | forced), judge, names)
                op = getattr(t.error, "op", None) if t.ctx is None else None
                if op not in order or op in forced or op in rc:
                    return t
                forced.add(op)  # type: ignore[arg-type]

        def prefix(j: int) -> frozenset[str]:
            return frozenset(order[:j])

        def trim(rc: frozenset[str], name: str) -> frozenset[str]:
            now = probe(rc, (name,)).fastest
            assert now is not None
            for op in sorted(rc, key=lambda o: -extra_of.get(o, 0.0))[:TRIM_TRIES]:
                ev = probe(rc - {op}, (name,)).fastest
                if ev is not None and ev.fits and ev.iteration_s < now.iteration_s:
                    rc, now = rc - {op}, ev
            return rc

        first = probe(prefix(lo), None)
        full = [first]
        if lo and first.fastest is not None and first.fastest.fits:  # the floor's prefix fits:
            full.append(probe(trim(prefix(lo), first.fastest.schedule.name), None))  # too long?
        freed = [0]  # kept bytes the first j candidates free, over all devices
        for c in cands:
            freed.append(freed[-1] + c.freed)
        for name in _targets(first):
            if name is None:
                continue

            def ok(j: int, name: str = name) -> bool:
                ev = probe(prefix(j), (name,)).fastest
                if ev is None or ev.fits:
                    return ev is not None
                if ev.iteration_s >= _time(out):
                    raise _Hopeless  # it needs more recompute, which only slows it further
                return False

            # a first guess: the shortest prefix that frees the plan's excess over all devices
            ev = probe(prefix(lo), (name,)).fastest
            assert ev is not None and first.ctx is not None
            excess = sum(max(0, m - first.ctx.topology.capacity) for m in ev.placement.memory)
            guess = next(
                (j for j in range(lo + 1, len(order) + 1) if freed[j] - freed[lo] >= excess),
                len(order),
            )
            try:
                j = _first(lo, len(order), ok, guess)
            except _Hopeless:
                continue
            if j is None:
                continue
            full.append(probe(trim(prefix(j), name), None))
        rounds = TARGETED_ROUNDS if len(judge.names) > 1 else 0
        t = _targeted(first, cands, probe, rounds, out)
        if t is not None and t.fastest is not None:
            full.append(probe(trim(t.levers.recompute, t.fastest.schedule.name), None))
        _overflow_reason(first, len(self.graph.metaops), out)
        fitting = [t for t in full if t.fitting is not None]
        if fitting:
            return min(fitting, key=lambda t: t.time_s)
        out.last = _closer(out.last, *full)
        return None

    def stages_at(self, k: int) -> tuple[int, ...]:
        """ZeRO stages to fit at k: ZeRO-1 (ZeRO-2 reduce-scatters every pass), then ZeRO-2
        only if ZeRO-1 needs recompute; at k = 1 the first alone, since one pass under ZeRO-2
        is ZeRO-1 in every figure the planner prices: the same one reduce-scatter
        (``cost.step.reductions_per_step``), gradients alive as long
        (``cost.memory.gradient_life``), the same parameter layout (``cost.memory.staged``),
        so the same allocations offered, the same plans and the same memory on every device.
        Fitting it too would repeat every probe for no other plan."""
        return self.stages[:1] if k == 1 else self.stages

    def _plain(self, judge: Judge, k: int, plain: dict[int, Trial], out: Fit) -> None:
        """Phase 1 at one k: no recompute, the first ZeRO stage (ZeRO-1 unless forced)."""
        t = self.trial(Levers(k, self.stages[0]), judge)
        plain[k] = plain.get(k) or t
        out.record(k, t)
        if t.fitting is not None and t.time_s < _time(out):
            out.best = t

    def _fit_stages(self, judge: Judge, k: int, plain: dict[int, Trial], out: Fit) -> None:
        """Phase 2 at one k: recompute and ZeRO-2, where they could win."""
        if plain_floor(plain[k]) >= _time(out) * SLOWER:
            return
        for z in self.stages_at(k):
            t = self.fit(judge, k, z, out)
            if t is not None:
                out.record(k, t)
                if t.time_s < _time(out):
                    out.best = t
            if t is not None and not t.levers.recompute:
                break  # the other stage could only save recompute, and none is on

    def between(self, plain: dict[int, Trial], out: Fit) -> tuple[int, ...]:
        """The k to try next around the best so far: the midpoints between it and the
        nearest k tried on either side (``refine_ks``), skipping any whose micro-batches are
        those of a smaller k tried (more passes of the same sizes: only slower)."""
        if out.best is None:
            return ()
        least: dict[tuple[int, ...], int] = {}  # micro-batch sizes -> the least k giving them
        for k in sorted(plain):
            least.setdefault(micro_sizes(self.graph, k), k)
        new = []
        for k in refine_ks(tuple(sorted(plain)), out.best.levers.micro_batches):
            sizes = micro_sizes(self.graph, k)
            if least.get(sizes, k) >= k:
                least[sizes] = k
                new.append(k)
        return tuple(new)

    def search(
        self, judge: Judge, ks: tuple[int, ...] | None = None, share: float = SEARCH_SHARE
    ) -> Fit:
        """Steps 1 to 3 of the module docstring over ``ks`` (default: every choice, then the
        k between them; a baseline's tuning passes the k the first search tried). Once a
        setting fits, each further step starts only while ``share`` of the budget is unspent:
        the search then returns the best found."""
        out = Fit()
        refine = ks is None and len(self.ks) > 1  # (a baseline's tuning gets the k tried)
        ks = ks or self.ks

        def more() -> bool:  # may a step past the first fitting setting start?
            left = self.budget.left() >= ROUND_TRIALS * self.slowest
            return out.best is None or (self.budget.within(share) and left)

        plain: dict[int, Trial] = {}
        size = self.graph.cluster.devices * len(self.graph.metaops)
        if refine and len(ks) > 1 and size >= AHEAD_SIZE:  # (the baselines' searches: none)
            self.send_ahead(Levers(ks[1], self.stages[0]), judge)
        for i, k in enumerate(ks):  # phase 1
            self._meanwhile(judge, k, ks[i + 1 : i + 2])
            self._plain(judge, k, plain, out)
            if plain_floor(plain[k]) > _time(out) or not (more() or held_back(plain[k], out)):
                break  # more passes would only be slower, or there is no time for them
        one = out.per_k.get(1)
        out.memory_binds = one is not None and one.fitting is None
        for k in sorted(plain):  # phase 2
            if more():
                self._fit_stages(judge, k, plain, out)
        # the k between the powers of two, where memory binds (where it does not, the
        # iteration is smooth in k, so they would cost planning time for no quicker plan)
        if refine and out.memory_binds:
            out.coarse = out.best
        for _ in range(REFINE_ROUNDS if out.coarse is not None else 0):
            new = self.between(plain, out)
            if not new or not more():
                break
            for k in new:
                self._plain(judge, k, plain, out)
                self._fit_stages(judge, k, plain, out)
        if out.best is not None and self.replicate and more():
            self._replicated(judge, out)
        if not self.explored:
            self.explored = sorted(plain)
        if out.best is not None:
            out.last = None
        elif out.last is None and plain:  # no setting was fitted: the most levers pulled
            out.last = _closer(None, *(plain[k] for k in sorted(plain, reverse=True)))
        return out

    def _replicated(self, judge: Judge, out: Fit) -> None:
        """Step 3: the optimizer state replicated instead of sharded at the best setting,
        where it still fits (a step without the all-gather after the update, each holder
        updating its parts in place): for a small job, quicker on every rank with the memory."""
        assert out.best is not None
        best = out.best.levers
        t = self.trial(replace(best, zero_stage=0), judge)
        if t.fitting is not None and t.time_s < _time(out):
            out.record(best.micro_batches, t)
            out.best = t


@dataclass(frozen=True)
class TrialRequest:
    """A setting of the levers as a helper judges it (picklable)."""

    graph: MetaGraph
    cost: CostModel
    levers: Levers
    judge: Judge
    kind_modules: tuple[str, ...] = ()


def remote_trial(request: TrialRequest) -> tuple[PlanContext | None, Caught] | None:
    """``request``'s setting judged in a helper (``helpers.answer``): its context, built there
    and holding the plans the judge placed, for the search to adopt (``LeverSearch.adopt``);
    None where no context can be built at the levers (the search then builds it itself and
    says why)."""
    r = request

    def work() -> PlanContext | None:
        return LeverSearch(r.graph, r.cost).trial(r.levers, r.judge).ctx

    return answer(r.kind_modules, work)


def refine_ks(tried: tuple[int, ...], best: int) -> tuple[int, ...]:
    """The whole midpoints between ``best`` and its neighbours in ``tried`` (sorted), below
    then above: one bisection step of the bracket around the best k on each side."""
    i = tried.index(best)
    out = []
    if i > 0 and best - tried[i - 1] > 1:
        out.append((tried[i - 1] + best) // 2)
    if i + 1 < len(tried) and tried[i + 1] - best > 1:
        out.append((best + tried[i + 1] + 1) // 2)
    return tuple(out)


def micro_sizes(graph: MetaGraph, k: int) -> tuple[int, ...]:
    """Every MetaOp's micro-batch at k: two k with the same sizes price the same passes."""
    return tuple(micro_batch(op.batch, k) for op in graph.metaops)


class _Hopeless(Exception):
    """A probe already slower than the best plan found: no longer prefix can win."""


def plain_floor(t: Trial) -> float:
    """What any setting at this trial's k costs at the least: recompute and ZeRO-2 only slow
    a pass down, so the quickest plan judged without them (fitting or not)."""
    f = t.fastest
    return f.iteration_s if f is not None else float("inf")


def _targets(t: Trial) -> tuple[str | None, ...]:
    """The schedules whose fit the recompute prefix is bisected on: the fastest judged one,
    then the one closest to fitting (when they differ)."""
    if t.ctx is None or not t.judged:
        return ()
    fast = t.fastest
    close = t.least_over()
    a = fast.schedule.name if fast is not None and not fast.fits else None
    b = close.schedule.name if close is not None and not close.fits else None
    return (a, b if b != a else None)


def _overflow_reason(t: Trial, total: int, out: Fit) -> None:
    ev = t.fastest
    if ev is None or ev.fits or t.ctx is None:
        return
    mem = ev.placement.memory
    d = max(range(len(mem)), key=mem.__getitem__)
    out.reasons.append(
        f"with {t.levers.describe(total)} the fastest plan ('{ev.schedule.name}') would hold "
        f"{gib(mem[d])} on device {d} of {gib(t.ctx.topology.capacity)}"
    )


def _first(lo: int, hi: int, ok: Callable[[int], bool], guess: int | None = None) -> int | None:
    """The least j in [lo, hi] with ``ok(j)`` (``ok`` taken as monotone), galloping from
    ``guess`` (default ``lo``) up or down then bisecting, so that a good guess costs a few
    probes and no longer prefix than needed is priced; None if not even ``ok(hi)``."""
    if ok(lo):
        return lo
    g = lo if guess is None else min(max(guess, lo + 1), hi) if hi > lo else lo
    if g > lo and ok(g):  # gallop down: bracket (bad, good] below the guess
        good, step = g, 1
        while True:
            j = max(good - step, lo)
            if j == lo or not ok(j):
                bad = j
                break
            good, step = j, 2 * step
    else:  # gallop up from the guess
        bad, step = g, 1
        while True:
            j = min(bad + step, hi)
            if ok(j):
                good = j
                break
            if j == hi:
                return None
            bad, step = j, 2 * step
    while good - bad > 1:
        mid = (bad + good) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def held_back(t: Trial, out: Fit) -> bool:
    """Whether memory holds the plan back at ``t``'s k: its quickest judged plan overflows
    and is ``HELD_BACK`` times quicker than the quickest fitting plan found."""
    f = t.fastest
    return f is not None and not f.fits and f.iteration_s * HELD_BACK < _time(out)


def _time(f: Fit) -> float:
    return f.best.time_s if f.best is not None else float("inf")


def _closer(a: Trial | None, *others: Trial) -> Trial | None:
    """Of non-fitting trials, the one whose closest plan overflows least."""
    best = a
    for b in others:
        if b.least_over() is None:
            best = best or b
            continue
        if best is None or best.least_over() is None:
            best = b
            continue
        kb = b.least_over().key(b.ctx.topology.capacity)  # type: ignore[union-attr]
        ka = best.least_over().key(best.ctx.topology.capacity)  # type: ignore[union-attr]
        if kb < ka:
            best = b
    return best


def _targeted(
    first: Trial,
    cands: tuple[Candidate, ...],
    probe: Callable[[frozenset[str], tuple[str, ...] | None], Trial],
    rounds: int,
    out: Fit,
) -> Trial | None:
    """The targeted alternative to the prefixes of ``LeverSearch.fit``: recompute added where
    the fastest plan overflows, round by round (``select_more``); the trial at which that
    plan fits, or None."""
    t, target = first, first.fastest
    for _ in range(rounds):
        if t.ctx is None or target is None or target.fits:
            break
        if t is not first and target.iteration_s >= _time(out):
            break  # it needs more recompute, which only slows it further
        more = select_more(t.ctx, target, cands)
        if not more:
            break
        t = probe(t.levers.recompute | set(more), (target.schedule.name,))
        target = t.fastest
    return t if t is not first and target is not None and target.fits else None
