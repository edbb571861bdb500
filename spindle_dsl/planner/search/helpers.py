"""One pool of helper processes for planning work that can run beside this process.

Four kinds of work go to it. The lever search's second setting, judged while this process
judges its first (``Ahead``; ``leversearch.remote_trial``). Runner-up rounds: where the lever
search leaves runner-up settings (``search.make.RUNNER_UP_MARGIN``), ``make_plan`` runs one
round per setting, each independent of the others (it reads only its own context;
``rounds.remote_round``), while this process plans the search's best. The lower bound, where
there is no runner-up (``make.remote_bound``, taken beside the round). Phases:
``plan_schedule`` plans each distinct graph of a schedule of mixes, the first here and the
others in helpers (``phases.remote_plan``).

A helper is a fresh interpreter (``isolate.warm_up`` on a channel of its own, for the reasons
``planner.solver.isolate`` gives against ``fork`` and ``spawn``), started at the beginning of
planning so that it imports the planner while the search runs, and kept for later plans. A
helper takes the next piece of work waiting; this process, once its own work is done (and
what does not wait on the helpers, ``meanwhile``), takes what is left. Each piece runs as it
would here, so the results are those of running them one after another (up to what
time-limited solves vary from run to run); only the wall time changes.

A helper needs a core no one else uses: by default one is started for each core the others
running leave idle beside this process (``spare_cores``); ``jobs`` sets how many (0: none,
as the plans that phases make in helpers ask). Compare ``spindle plan
examples/qwen_val.spindle --mix audio_heavy --devices 64 --jobs 0`` against ``--jobs 1``: the
same plan, in less wall time. The CLI starts the helpers first, while the spec compiles, and
the solver process only once they are up (``isolate.warm_up``'s ``after``). A graph whose
layer kinds are registered by a script (``__main__``) or by a module a fresh interpreter
cannot import cannot be rebuilt in a helper, nor a cost model whose class it cannot import:
that work runs here. A helper that dies, hangs or fails a piece costs only that: the piece
runs here, with a warning.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from spindle_dsl.cluster import usable_cores
from spindle_dsl.kinds.base import get_kind
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.planner.solver import isolate
from spindle_dsl.planner.solver.choice import SolverChoice

T = TypeVar("T")
R = TypeVar("R")  # a piece of work, as sent to a helper
A = TypeVar("A")  # its answer
Caught = tuple[tuple[type[Warning], str], ...]  # warnings raised in a helper, raised again here
HELPER = "a planning helper"  # where a helper's solves run (``SolverChoice.host``)
CHANNEL = "planning helper"  # ``isolate`` channel names: this, then " 2", " 3", ...
PREPARE = "spindle_dsl.planner.search.helpers:prepare"
POLL_S = 0.02  # how often a helper's thread looks whether its process is ready
# a round's placements and polish outlast its solver time by seconds at 1,024 devices
GRACE_S = 120.0


def prepare() -> None:
    """In a helper, before it says ready: import the planner and the built-in kinds."""
    import spindle_dsl.planner  # noqa: F401
    from spindle_dsl.kinds.base import kind_names

    kind_names()


def spare_cores() -> int:
    """Cores this process may run on (``cluster.usable_cores``) that others leave idle beside
    this process itself (one runnable task while it plans): the cores less what runs, taken as
    the lesser of the last minute's load average and the tasks runnable right now
    (``/proc/loadavg``, where there is one). The average alone would count this process's own
    helpers, busy in the plans just made (a benchmark planning one job after another would
    then stop using them), and a snapshot alone is noise; a machine others keep busy shows in
    both."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    try:  # "0.41 0.77 1.19 2/190 4321": the fourth field is runnable / all tasks
        running = float(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        load = min(load, running)
    except (OSError, IndexError, ValueError):
        pass
    return max(0, round(usable_cores() - max(load, 1.0)))


def helper_count(jobs: int | None, most: int) -> int:
    """Helpers to plan with: ``jobs`` where given, else one per spare core, at most ``most``
    (the pieces of work there can be)."""
    return max(0, jobs) if jobs is not None else min(most, spare_cores())


def kind_modules(graph: MetaGraph) -> tuple[str, ...] | None:
    """The modules outside this package that register ``graph``'s layer kinds (a helper
    imports them), None where one is a script's (``__main__``), which a helper cannot."""
    out = set()
    for module in graph.modules:
        where = type(get_kind(module.kind)).__module__
        if where == "__main__":
            return None
        if not where.startswith("spindle_dsl."):
            out.add(where)
    return tuple(sorted(out))


def has_rounds(scheduler: str, check_memory: bool) -> bool:
    """Whether a plan with these options can have runner-up rounds for helpers (the lever
    search runs only with memory checked, and only the MILP schedulers plan runner-ups)."""
    return check_memory and scheduler in ("default", "milp")


def start(count: int) -> tuple[str, ...]:
    """Start ``count`` helpers (those already running are kept); their channels."""
    names = tuple(CHANNEL if i == 0 else f"{CHANNEL} {i + 1}" for i in range(count))
    for name in names:
        isolate.warm_up(name, prepare=PREPARE)
    return names


def answer(kind_modules: Sequence[str], work: Callable[[], A]) -> tuple[A, Caught] | None:
    """In a helper: ``work()`` with the warnings it raised, for the caller to raise again,
    after importing the modules that register the graph's kinds; None where one of them does
    not import here (registered by a module only the caller's import system finds: the caller
    does the work itself)."""
    try:
        for module in kind_modules:
            importlib.import_module(module)
    except ImportError:
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = work()
    return out, tuple((w.category, str(w.message)) for w in caught)


def solving_here(choice: SolverChoice) -> SolverChoice:
    """``choice`` for solves in a helper: the helper is the isolation (a solver crash ends it,
    and the caller does its work again), so no solver process of its own is started."""
    return replace(choice, isolated=False, host=HELPER) if choice.isolated else choice


def up(channel: str, go_on: Callable[[], bool]) -> bool:
    """Wait for the helper on ``channel`` to be ready, while ``go_on()``; False where it died
    or the caller no longer needs it."""
    while not isolate.ready(channel, POLL_S):
        if not go_on() or not isolate.alive(channel):
            return False
    return go_on()


def serve_one(
    channel: str, remote: Callable[[R], tuple[A, Caught] | None], request: R, timeout: float
) -> tuple[tuple[A, Caught] | None, str]:
    """``remote(request)`` in the helper on ``channel``: its answer, or None to do the work
    here (a cost model a script defined, kinds the helper cannot import, the helper lost),
    and what to warn of a helper lost."""
    try:
        return isolate.call(remote, (request,), timeout, channel), ""
    except isolate.CallNotLoaded:
        return None, ""
    except isolate.SolverCrash as e:
        return None, f"the {channel} process failed its work ({e.reason}); did it here"


def said_there(caught: Caught) -> None:
    """Raise here the warnings a helper's work raised there."""
    for category, message in caught:
        warnings.warn(message, category, stacklevel=3)


class Ahead:
    """One piece of work sent to a helper before this process needs it: the helper starts it
    once it is up, unless this process has taken it back by then (``take`` then answers
    None, and the caller does the work itself); once started, ``take`` waits for it. Work
    this process never takes keeps the helper busy until done, so only what it will likely
    need is sent."""

    def __init__(
        self,
        channel: str,
        remote: Callable[[R], tuple[A, Caught] | None],
        request: R,
        limit_s: float,
    ):
        self._lock = threading.Lock()
        self._state = "waiting"  # then "started", or "withdrawn" by ``take``
        self._got: tuple[A, Caught] | None = None
        self._lost = ""
        args = (channel, remote, request, GRACE_S + limit_s + isolate.GRACE_S)
        self._thread = threading.Thread(target=self._run, args=args, daemon=True)
        self._thread.start()

    def _run(self, channel: str, remote: Callable, request: object, timeout: float) -> None:
        if not up(channel, lambda: self._state == "waiting"):
            return
        with self._lock:
            if self._state != "waiting":
                return
            self._state = "started"
        self._got, self._lost = serve_one(channel, remote, request, timeout)

    def busy(self) -> bool:
        """Whether the helper has started the work and not yet answered."""
        return self._state == "started" and self._thread.is_alive()

    def take(self) -> A | None:
        """The answer (its warnings raised here), or None: not started, or given back."""
        with self._lock:
            if self._state == "waiting":
                self._state = "withdrawn"
                return None
        self._thread.join()
        if self._lost:
            warnings.warn(self._lost, isolate.SolverCrashWarning, stacklevel=2)
        if self._got is None:
            return None
        answer, caught = self._got
        said_there(caught)
        return answer


def side_by_side(
    own: Callable[[], T],
    requests: Sequence[R],
    here: Callable[[int], A],
    helpers: Sequence[str],
    remote: Callable[[R], tuple[A, Caught] | None],
    limit_s: float,
    meanwhile: Callable[[T], object] | None = None,
) -> tuple[T, list[A]]:
    """``own()`` here, and every request's answer, by the helpers on ``helpers`` (each runs
    ``remote(request)``, a module-level function, at most ``limit_s`` plus a grace) or here
    (``here(i)`` answers request i in this process) once ``own`` is done; the answers in
    request order. ``remote`` returns None to give a request back (it cannot be rebuilt
    there). ``meanwhile`` runs here on ``own``'s result right after it, while the helpers
    work (what the caller needs whatever they find; this process then takes the requests
    still waiting). Warnings (a solver crash in a helper, a helper lost) are raised here,
    after the work, in request order."""
    waiting = deque(range(len(requests)))
    done: dict[int, A] = {}
    said: dict[int, Caught] = {}
    lost: list[str] = []
    stop = threading.Event()
    timeout = GRACE_S + 2 * limit_s + isolate.GRACE_S

    def serve(channel: str) -> None:
        if not up(channel, lambda: not stop.is_set() and bool(waiting)):
            return
        while not stop.is_set():
            try:
                i = waiting.popleft()
            except IndexError:
                return
            got, why = serve_one(channel, remote, requests[i], timeout)
            if why:
                lost.append(why)
            if got is None:  # (it runs here)
                waiting.appendleft(i)
                return
            done[i], said[i] = got

    threads = [threading.Thread(target=serve, args=(c,), daemon=True) for c in helpers]
    for t in threads:
        t.start()
    try:
        mine = own()
        if meanwhile is not None:  # (first: the helpers work meanwhile)
            meanwhile(mine)
        while True:
            try:
                i = waiting.popleft()
            except IndexError:
                break
            done[i] = here(i)
    finally:
        stop.set()
        for t in threads:
            t.join()
    for i in range(len(requests)):  # what a helper gave back after this process finished
        if i not in done:
            done[i] = here(i)
    for message in lost:
        warnings.warn(message, isolate.SolverCrashWarning, stacklevel=2)
    for i in sorted(said):
        said_there(said[i])
    return mine, [done[i] for i in range(len(requests))]
