"""A planning session without a kernel: settings in, plan and pictures out.

The widget is a thin shell over this module, so everything a person can do with the controls
can be done (and tested) here with plain Python. A session holds the user's current settings
(spec text, cluster overrides, mix and weights, scheduler) and turns them into a ``View``: the
plan, its pictures and summary, the spec's errors and warnings.

Two rules shape it:
- Unchanged inputs are never recomputed. Compiles, plans and pictures are cached by the inputs
  that determine them, so moving a slider back to an earlier value costs a dictionary lookup.
- A broken spec (or a plan that does not fit) never blanks the outputs. The view keeps the last
  good result next to the error, marked stale, so the user sees what they are fixing.

A slider move gets a quick plan (``INTERACTIVE_TIME_LIMIT_S``); the full search may follow:
``refinement()`` says what to search further, the caller runs it where it likes (the widget:
in a process of its own, ``follow.py``) and ``adopt()`` puts its plan in the cache, and in the
view where it is quicker and its settings are still shown.

The stages are injected as a ``Pipeline`` so the session can be driven by fakes in unit tests
and by the real language/cost/planner/render stages everywhere else (``pipeline.py``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from spindle_dsl.errors import SpindleError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.bundle import BundlePhase, PlanBundle
from spindle_dsl.plan.model import Plan, SpecRef
from spindle_dsl.widgets.mixes import MixInfo, custom_mix_text

# --- values ----------------------------------------------------------------------------------

# The planner's time per re-plan (``make_plan``'s whole budget): a slider move must redraw in
# under half a second, and the search returns its best plan so far when the time is spent
# (measured: python -m spindle_dsl.widgets.bench).
INTERACTIVE_TIME_LIMIT_S = 0.4
# The full search's budget (the planner's default, ``DEFAULT_TIME_LIMIT_S``): once a slider
# move's quick plan is shown, a search this long runs in the background and its plan replaces
# the quick one where quicker (``PlanningSession.refinement``).
FULL_TIME_LIMIT_S = 10.0


@dataclass(frozen=True)
class PlanOptions:
    """What the planner is asked besides the graph."""

    scheduler: str = "default"
    check_memory: bool = True  # False: show plans that overflow memory, with notes saying where
    time_limit_s: float = INTERACTIVE_TIME_LIMIT_S


@dataclass(frozen=True)
class Settings:
    """Everything the user controls. ``None`` means "as the spec says"."""

    text: str
    path: str = "<string>"
    devices: int | None = None
    device: str | None = None  # a preset name
    mix: str | None = None  # a mix declared in the spec (default: the spec's first)
    weights: tuple[tuple[str, float], ...] = ()  # per-task weight overrides of that mix
    scheduler: str = "default"
    check_memory: bool = True  # False: show plans that overflow memory, with notes saying where
    time_limit_s: float = INTERACTIVE_TIME_LIMIT_S  # the planner's time per re-plan

    def plan_options(self) -> PlanOptions:
        return PlanOptions(self.scheduler, self.check_memory, self.time_limit_s)

    def cluster_overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.devices is not None:
            out["devices"] = self.devices
        if self.device is not None:
            out["device"] = self.device
        return out


@dataclass(frozen=True)
class Compiled:
    """What the session needs from the language stage."""

    graph: MetaGraph
    warnings: tuple[str, ...]  # rendered warning diagnostics
    mixes: tuple[MixInfo, ...]  # every mix the spec declares, in order
    # (first step, mix) of each phase when the spec's schedule is followed (no mix named)
    phases: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class Pictures:
    """The drawings of one plan, as markup an HTML widget (or a browser) shows directly."""

    waves: str  # SVG: the waves on the devices
    timeline: str  # SVG: entries over time, a row per device
    memory: str  # SVG: predicted peak memory per device against capacity
    phases: str = ""  # SVG: a schedule's phases on a timeline of training steps ("" without)


@dataclass(frozen=True)
class Pipeline:
    """The stages a session runs; each is a plain function so tests can pass fakes."""

    compile: Callable[[str, str, str | None, dict[str, Any]], Compiled]
    plan: Callable[[MetaGraph, PlanOptions], Plan]
    draw: Callable[[Plan, MetaGraph], Pictures]
    schedulers: tuple[str, ...] = ("default",)
    draw_phases: Callable[[PlanBundle], str] | None = None  # the phases picture
    # the full search's plan (blocking: the widget calls it from a background thread) and how
    # to abandon one in flight, which then raises; None: only the quick plans are shown
    refine: Callable[[MetaGraph, PlanOptions], Plan] | None = None
    abandon_refine: Callable[[], None] | None = None


@dataclass(frozen=True)
class Timings:
    """Wall seconds of the stages this update actually ran (0 when served from the cache)."""

    compile_s: float = 0.0
    plan_s: float = 0.0
    draw_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compile_s + self.plan_s + self.draw_s


@dataclass(frozen=True)
class Result:
    """A good outcome: the plan for ``settings`` and everything drawn from it."""

    settings: Settings
    graph: MetaGraph
    plan: Plan
    pictures: Pictures
    warnings: tuple[str, ...]
    mixes: tuple[MixInfo, ...]
    effective_text: str  # the spec text actually compiled (with a generated mix if weighted)
    effective_mix: str | None
    bundle: PlanBundle | None = None  # a plan per phase, when the spec's schedule is followed


@dataclass(frozen=True)
class Refinement:
    """A plan shown that the full search may improve: its cache key, its graph and the full
    search's options."""

    key: tuple[Any, ...]
    graph: MetaGraph
    options: PlanOptions


@dataclass(frozen=True)
class View:
    """What the outputs show after an update.

    ``result`` is the newest good result: for ``settings`` itself when ``error`` is None, or the
    last good one (``stale``) when the current settings fail.
    """

    settings: Settings
    result: Result | None
    error: str | None = None  # rendered diagnostics with carets
    error_lines: tuple[int, ...] = ()  # 1-based spec lines the errors point at
    timings: Timings = field(default_factory=Timings)
    cached: bool = False  # True when nothing had to be recomputed
    full_search: bool = False  # the plan shown is the full search's (or it found none quicker)

    @property
    def stale(self) -> bool:
        return self.error is not None and self.result is not None

    @property
    def ok(self) -> bool:
        return self.error is None and self.result is not None


# --- a small LRU cache -------------------------------------------------------------------------

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A bounded mapping that forgets the least recently used entry; counts hits for tests."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[K, V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: K) -> V | None:
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        return None

    def peek(self, key: K) -> V | None:
        """The entry, without counting a hit or a miss or refreshing it."""
        return self._data.get(key)

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


# --- the session -------------------------------------------------------------------------------


class PlanningSession:
    """Turns settings into views, caching each stage and remembering the last good result."""

    def __init__(self, pipeline: Pipeline, settings: Settings, *, cache_size: int = 64) -> None:
        self.pipeline = pipeline
        self._compiled: LRU[tuple[Any, ...], Compiled | SpindleError] = LRU(cache_size)
        self._planned: LRU[tuple[Any, ...], tuple[Plan, Pictures] | SpindleError] = LRU(cache_size)
        self.last_good: Result | None = None
        self._shown: tuple[tuple[Any, ...], MetaGraph] | None = None  # the plan shown's key
        self._full: set[tuple[Any, ...]] = set()  # keys whose plan the full search has judged
        self.settings = settings
        self.view = self._evaluate(settings)

    # The one way to change anything: the widget calls this for every control.
    def update(self, **changes: Any) -> View:
        """Apply ``changes`` (fields of ``Settings``) and return the new view."""
        if "weights" in changes and isinstance(changes["weights"], dict):
            changes["weights"] = tuple(sorted(changes["weights"].items()))
        if "mix" in changes and changes["mix"] != self.settings.mix and "weights" not in changes:
            changes["weights"] = ()  # a different mix starts from its own weights
        self.settings = replace(self.settings, **changes)
        self.view = self._evaluate(self.settings)
        return self.view

    def refinement(self) -> Refinement | None:
        """What the full search may improve of the plan shown: None where there is nothing
        to improve (no plan, a stale one, one the full search has judged, a planning time as
        long as the full search's) or no stage to do it."""
        if self.pipeline.refine is None or not self.view.ok or self._shown is None:
            return None
        key, graph = self._shown
        options = self.settings.plan_options()
        if key in self._full or options.time_limit_s >= FULL_TIME_LIMIT_S:
            return None
        return Refinement(key, graph, replace(options, time_limit_s=FULL_TIME_LIMIT_S))

    def adopt(self, refinement: Refinement, plan: Plan) -> View | None:
        """Take the full search's ``plan`` for ``refinement`` where it is quicker than the
        quick plan (a move back to those settings then shows it from the cache). Returns the
        new view where those settings are still shown, else None."""
        self._full.add(refinement.key)
        hit = self._planned.peek(refinement.key)
        if not isinstance(hit, SpindleError) and (
            hit is None or plan.iteration_s < hit[0].iteration_s
        ):
            self._planned.put(refinement.key, (plan, self.pipeline.draw(plan, refinement.graph)))
        if self._shown is None or self._shown[0] != refinement.key:
            return None
        self.view = self._evaluate(self.settings)
        return self.view

    @property
    def cache_stats(self) -> dict[str, int]:
        return {
            "compile_hits": self._compiled.hits,
            "compile_misses": self._compiled.misses,
            "plan_hits": self._planned.hits,
            "plan_misses": self._planned.misses,
        }

    # --- stages, each behind its cache ----------------------------------------------------------
    def _compile(
        self, text: str, path: str, mix: str | None, overrides: dict[str, Any], t: list[float]
    ) -> Compiled:
        key = (text, path, mix, tuple(sorted(overrides.items())))
        hit = self._compiled.get(key)
        if hit is None:
            start = time.perf_counter()
            try:
                hit = self.pipeline.compile(text, path, mix, overrides)
            except SpindleError as exc:
                hit = exc
            t[0] += time.perf_counter() - start
            self._compiled.put(key, hit)
        if isinstance(hit, SpindleError):
            raise hit
        return hit

    def _plan(
        self,
        key: tuple[Any, ...],
        graph: MetaGraph,
        s: Settings,
        t: list[float],
        *,
        draw: bool = True,
    ) -> tuple[Plan, Pictures | None]:
        """The plan for ``key`` and, when ``draw``, its pictures (a schedule's other phases
        need only their plans; their pictures are drawn if the user picks their mix)."""
        hit = self._planned.get(key)
        if hit is None or (draw and not isinstance(hit, SpindleError) and hit[1] is None):
            try:
                start = time.perf_counter()
                plan = hit[0] if hit is not None else self.pipeline.plan(graph, s.plan_options())
                if hit is None:  # (a quick plan again, where the cache had let the full go)
                    self._full.discard(key)
                mid = time.perf_counter()
                t[1] += mid - start
                pictures = self.pipeline.draw(plan, graph) if draw else None
                t[2] += time.perf_counter() - mid
                hit = (plan, pictures)
            except SpindleError as exc:
                hit = exc
            self._planned.put(key, hit)
        if isinstance(hit, SpindleError):
            raise hit
        return hit

    def _evaluate(self, s: Settings) -> View:
        t = [0.0, 0.0, 0.0]
        misses_before = self._compiled.misses + self._planned.misses
        self._shown = None
        try:
            result = self._run(s, t)
        except SpindleError as exc:
            view = View(
                settings=s,
                result=self.last_good,
                error=exc.render(),
                error_lines=_error_lines(exc),
                timings=Timings(*t),
            )
        else:
            self.last_good = result
            view = View(settings=s, result=result, timings=Timings(*t))
        cached = self._compiled.misses + self._planned.misses == misses_before
        full = self._shown is not None and self._shown[0] in self._full
        return replace(view, cached=cached, full_search=full)

    def _run(self, s: Settings, t: list[float]) -> Result:
        overrides = s.cluster_overrides()
        if s.time_limit_s <= 0:
            raise SpindleError(f"the planning time must be positive, got {s.time_limit_s}")
        if s.scheduler not in self.pipeline.schedulers:
            known = ", ".join(self.pipeline.schedulers)
            raise SpindleError(f"unknown scheduler '{s.scheduler}' (known: {known})")
        base = self._compile(s.text, s.path, s.mix, overrides, t)
        text, mix, compiled = s.text, s.mix, base
        # weights of tasks the (edited) spec no longer has are dropped, not turned into errors
        # on generated lines the user cannot see
        tasks = {t.name for t in base.graph.tasks}
        weights = {t: w for t, w in s.weights if t in tasks}
        if weights:
            selected = _selected_mix(base, s.mix)
            custom = custom_mix_text(s.text, selected, weights, (m.name for m in base.mixes))
            if custom is not None:
                text, mix = custom
                compiled = self._compile(text, s.path, mix, overrides, t)
        key = (text, s.path, mix, tuple(sorted(overrides.items())), s.plan_options())
        plan, pictures = self._plan(key, compiled.graph, s, t)
        assert pictures is not None, "a drawn plan has its pictures"
        self._shown = (key, compiled.graph)
        bundle = None
        if compiled.phases and self.pipeline.draw_phases is not None:
            bundle = self._phases(compiled, plan, s, overrides, t)
            start = time.perf_counter()
            pictures = replace(pictures, phases=self.pipeline.draw_phases(bundle))
            t[2] += time.perf_counter() - start
        return Result(
            settings=s,
            graph=compiled.graph,
            plan=plan,
            pictures=pictures,
            warnings=compiled.warnings,
            mixes=base.mixes,
            effective_text=text,
            effective_mix=compiled.graph.mix,
            bundle=bundle,
        )

    def _phases(
        self, compiled: Compiled, plan: Plan, s: Settings, overrides: dict, t: list[float]
    ) -> PlanBundle:
        """A plan for every phase of the schedule (the first is ``plan``), each compile and
        plan behind the session's caches, so a slider move re-plans each phase once."""
        plans: dict[str, Plan] = {compiled.graph.mix or "": plan}
        for _, mix in compiled.phases:
            if mix not in plans:
                graph = self._compile(s.text, s.path, mix, overrides, t).graph
                key = (s.text, s.path, mix, tuple(sorted(overrides.items())), s.plan_options())
                plans[mix] = self._plan(key, graph, s, t, draw=False)[0]
        g = compiled.graph
        phases = tuple(BundlePhase(step, mix, plans[mix]) for step, mix in compiled.phases)
        return PlanBundle(SpecRef(g.spec_path, g.spec_sha256, None), phases)


def _selected_mix(compiled: Compiled, name: str | None) -> MixInfo:
    """The mix that weights override: the named one, or the one the compile selected."""
    want = name if name is not None else compiled.graph.mix
    for m in compiled.mixes:
        if m.name == want:
            return m
    raise SpindleError(
        "task weights can only be changed when the spec declares a mix "
        "(add `mix NAME { global_batch = N; TASK = WEIGHT }`)"
    )


def _error_lines(exc: SpindleError) -> tuple[int, ...]:
    """The spec lines that errors point at, for highlighting them next to the text area."""
    return tuple(sorted({d.span.line for d in exc.errors if d.span is not None}))
