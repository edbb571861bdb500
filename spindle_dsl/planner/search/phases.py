"""Plan every phase of a schedule: one plan per distinct MetaGraph, several at once.

Where the time goes (measured with ``bench/schedule_bench.py``): curves and planning contexts
cost milliseconds, the MILP and the placement of candidates cost the rest (most of a phase's
planning time, bounded by the time limit). So sharing curves between phases buys nothing
worth its complexity, while two things do pay:

* phases whose graphs are equal (the same mix twice, or two mixes that give every task the
  same batch) are planned once and share the plan;
* distinct graphs are planned side by side: this process plans the first while up to
  ``jobs`` worker processes plan the others. A worker is a fresh interpreter
  (``python -c``), not a ``multiprocessing`` child, for the reasons ``planner.solver.isolate``
  gives: a fork would share the parent's solver process and locks, and a spawn would re-run
  a user script's top-level code. Each worker starts its own solver process, so a solver
  crash in one phase is a warning there, as in a single plan. A worker costs its start
  (imports, its solver process), and it needs a core of its own: side by side pays on cores
  that are otherwise idle and costs a lot on cores a dozen other processes keep busy
  (``bench/schedule_bench.py`` times both ways). So by default a worker is started only for a
  core the load average says is idle.

With one distinct graph, or ``jobs=0``, everything runs in this process. The plans made side
by side start no helpers of their own for their runner-up rounds (``planner.search.round_helper``):
the phases already fill the cores.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from spindle_dsl.errors import PlanError, SpindleError
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.phases import MixSchedule
from spindle_dsl.plan.bundle import BundlePhase, PlanBundle
from spindle_dsl.plan.model import Plan, SpecRef

if TYPE_CHECKING:
    from spindle_dsl.cost.profile import Profile

_CHILD = "import sys; from spindle_dsl.planner.search.phases import _serve; _serve(sys.argv[1])"


@dataclass(frozen=True)
class PlanRequest:
    """What planning one graph needs (picklable: it travels to a worker process)."""

    graph: MetaGraph
    # a `spindle profile` file or a loaded profile (the profile cache's), else the analytic model
    profile: str | Profile | None = None
    scheduler: str = "default"
    time_limit_s: float | None = None  # None: the planner's default
    check_memory: bool = True
    solver: str | None = None
    micro_batches: int | None = None  # force the lever (None: the planner chooses)
    zero_stage: int | None = None
    # helper processes for its runner-up rounds (``planner.search.round_helper``; None: its default)
    helpers: int | None = None
    tp: int | None = None  # force this tensor-parallel degree (``--tp``; None: the model chooses)


def plan_one(request: PlanRequest) -> Plan:
    """``make_plan`` for one graph, with the cost model the request names."""
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.planner import DEFAULT_TIME_LIMIT_S, make_plan

    r = request
    return make_plan(
        r.graph,
        make_cost_model(r.graph.cluster, profile=r.profile, tp=r.tp),
        scheduler=r.scheduler,
        time_limit_s=DEFAULT_TIME_LIMIT_S if r.time_limit_s is None else r.time_limit_s,
        check_memory=r.check_memory,
        solver=r.solver,
        micro_batches=r.micro_batches,
        zero_stage=r.zero_stage,
        jobs=r.helpers,
    )


def _problem(graph: MetaGraph) -> MetaGraph:
    """The graph without what the planner never reads: its mix's name and task weights."""
    return replace(graph, mix=None, tasks=tuple(replace(t, weight=None) for t in graph.tasks))


def distinct_graphs(schedule: MixSchedule) -> tuple[list[MetaGraph], list[int]]:
    """The graphs to plan, and for each phase the index of its graph among them (graphs that
    differ only in their mix's name and weights, not in any batch, are the same problem)."""
    graphs: list[MetaGraph] = []
    index: list[int] = []
    for p in schedule.phases:
        bare = _problem(p.graph)
        found = next((i for i, g in enumerate(graphs) if _problem(g) == bare), None)
        if found is None:
            graphs.append(p.graph)
            found = len(graphs) - 1
        index.append(found)
    return graphs, index


def plan_schedule(
    schedule: MixSchedule,
    *,
    profile: str | Profile | None = None,
    scheduler: str = "default",
    time_limit_s: float | None = None,
    check_memory: bool = True,
    solver: str | None = None,
    jobs: int | None = None,
    micro_batches: int | None = None,
    zero_stage: int | None = None,
    tp: int | None = None,
) -> PlanBundle:
    """A plan per phase of ``schedule``, as a bundle. ``jobs``: worker processes planning
    beside this one (default: one per distinct graph but the first, at most the number of
    idle cores, ``idle_cores``; 0 plans everything here). ``micro_batches``/``zero_stage``
    force that lever in every phase (``make_plan``), ``tp`` that tensor-parallel degree
    (``make_cost_model``). Raises ``PlanError`` naming the phase
    that cannot be planned."""
    t0 = time.perf_counter()
    graphs, index = distinct_graphs(schedule)
    most = jobs if jobs is not None else idle_cores()
    workers = max(0, min(len(graphs) - 1, most))
    # phases side by side already fill the cores, and ``jobs=0`` asks for one process
    helpers = 0 if workers or jobs == 0 else None
    requests = [
        PlanRequest(
            g,
            profile,
            scheduler,
            time_limit_s,
            check_memory,
            solver,
            micro_batches,
            zero_stage,
            helpers,
            tp,
        )
        for g in graphs
    ]
    outcomes = _side_by_side(requests, workers) if workers else _here(requests)
    phases = []
    for p, i in zip(schedule.phases, index, strict=True):
        outcome = outcomes[i]
        if isinstance(outcome, str):
            raise PlanError(f"phase from step {p.first_step} (mix '{p.mix}'): {outcome}")
        plan = outcome if outcome.spec.mix == p.mix else _for_mix(outcome, p.mix)
        phases.append(BundlePhase(p.first_step, p.mix, plan))
    first = schedule.phases[0].graph
    return PlanBundle(
        SpecRef(first.spec_path, first.spec_sha256, None),
        tuple(phases),
        {
            "wall_s": time.perf_counter() - t0,
            "worker_processes": workers,
            "plans": len(graphs),
            "phases_sharing_a_plan": len(schedule) - len(graphs),
        },
    )


def idle_cores() -> int:
    """Cores this process may use that the last minute's load average leaves idle (the CPU
    count where the platform keeps no load average)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return max(0, int((cores or 1) - load))


def _for_mix(plan: Plan, mix: str) -> Plan:
    return replace(plan, spec=replace(plan.spec, mix=mix))


def _here(requests: list[PlanRequest]) -> list[Plan | str]:
    out: list[Plan | str] = []
    for r in requests:
        try:
            out.append(plan_one(r))
        except SpindleError as exc:
            out.append(exc.render())
    return out


def _side_by_side(requests: list[PlanRequest], workers: int) -> list[Plan | str]:
    """The first request planned here while worker processes plan the others, ``workers``
    at a time; a worker's warnings (solver crashes) are raised again here."""
    out: list[Plan | str | None] = [None] * len(requests)
    with tempfile.TemporaryDirectory(prefix="spindle-phases-") as tmp:
        folder = Path(tmp)
        pending = list(range(1, len(requests)))
        running: dict[int, tuple[subprocess.Popen, object]] = {}
        mine = True
        while mine or pending or running:
            while pending and len(running) < workers:
                i = pending.pop(0)
                (folder / f"request-{i}.pkl").write_bytes(pickle.dumps(requests[i]))
                err = (folder / f"stderr-{i}").open("w+b")
                proc = subprocess.Popen(
                    [sys.executable, "-c", _CHILD, str(folder / f"request-{i}.pkl")],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=_child_env(),
                )
                running[i] = (proc, err)
            if mine:
                out[0], mine = _here(requests[:1])[0], False
                continue
            done = [i for i, (proc, _) in running.items() if proc.poll() is not None]
            if not done:
                time.sleep(0.01)
                continue
            for i in done:
                proc, err = running.pop(i)
                out[i] = _collect(folder, i, proc.returncode, err)
    return out  # type: ignore[return-value]


def _collect(folder: Path, i: int, code: int, err) -> Plan | str:
    result = folder / f"request-{i}.pkl.out"
    err.seek(0)
    stderr = err.read().decode(errors="replace").strip()
    err.close()
    if code != 0 or not result.exists():
        tail = stderr.splitlines()[-1] if stderr else f"exit status {code}"
        return f"the planning process failed: {tail}"
    kind, payload, caught = pickle.loads(result.read_bytes())
    for category, message in caught:
        warnings.warn(message, category, stacklevel=4)
    return payload if kind == "plan" else str(payload)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([package_root, *(p for p in sys.path if p)]))
    return env


def _serve(request_path: str) -> None:
    """A worker: plan one request, pickle (kind, plan or message, warnings) beside it."""
    request = pickle.loads(Path(request_path).read_bytes())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out: tuple = ("plan", plan_one(request))
        except SpindleError as exc:
            out = ("error", exc.render())
    kept = [(w.category, str(w.message)) for w in caught if issubclass(w.category, Warning)]
    Path(request_path + ".out").write_bytes(pickle.dumps((*out, kept)))
