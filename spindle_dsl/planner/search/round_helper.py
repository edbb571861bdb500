"""Runner-up rounds planned in helper processes while this process plans its own setting.

Where the lever search leaves runner-up settings (``search.make.RUNNER_UP_MARGIN``), ``make_plan``
runs one MILP round per setting, the time limit shared between them: on qwen_val at 32 and 64
devices, several rounds that take most of a plan's time after the search. The rounds are
independent (each reads only its own context) and each keeps a core
busy (Python placing candidates, and its solves), so a helper process plans the runner-ups
while this one plans the search's best: a fresh interpreter started at the beginning of
planning (``isolate.warm_up`` on a channel of its own: it imports the planner while the search
runs) and kept for later plans. Its solves run in it (``rounds.remote_round``): it is already
isolated from this process. A helper takes the next round waiting; this process, once its own
round is done and the work that does not wait on the rounds (the baselines' own levers, the
lower bound), takes what is left. Each round gets the same time limit as it would one after
another, so the plans are those of rounds one after another (up to what time-limited solves
vary from run to run); only the wall time changes.

A helper needs a core no one else uses: by default one is started for each core the others
running leave idle beside this process (``spare_cores``), up to one per runner-up round;
``jobs`` sets how many (0: none, as ``planner.search.phases`` asks of the plans its own workers
make). Starting one costs the search beside it a little (its imports take a core for a
moment), and planning the rounds side by side saves more where there are runner-ups (compare
``spindle plan examples/qwen_val.spindle --mix audio_heavy --devices 64 --jobs 0`` against
``--jobs 1``: the same plan, in less wall time). The CLI starts it first, while the spec
compiles, and the solver process only once it is up (``isolate.warm_up``'s ``after``): the
two importing at once beside the search slow it more than the two one after the other. A
graph whose layer kinds are registered by a script (``__main__``) or by a module a fresh
interpreter cannot import cannot be rebuilt in a helper, nor a cost model whose class it
cannot import: their rounds run here.
A helper that dies, hangs or fails a round costs only that: the round runs here, with a
warning.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from spindle_dsl.cluster import usable_cores
from spindle_dsl.kinds.base import get_kind
from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.planner.search.rounds import Caught, Round, RoundRequest, remote_round
from spindle_dsl.planner.solver import isolate

T = TypeVar("T")
CHANNEL = "planning helper"  # ``isolate`` channel names: this, then " 2", " 3", ...
PREPARE = "spindle_dsl.planner.search.round_helper:prepare"
POLL_S = 0.02  # how often a helper's thread looks whether its process is ready
# a round's placements and polish outlast its solver time by seconds at 1,024 devices
ROUND_GRACE_S = 120.0


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
    (the runner-up rounds a plan can have)."""
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


def side_by_side(
    own: Callable[[], T],
    requests: Sequence[RoundRequest],
    here: Callable[[int], Round],
    helpers: Sequence[str],
    remote: Callable[[RoundRequest], tuple[Round, Caught] | None] = remote_round,
    meanwhile: Callable[[T], object] | None = None,
) -> tuple[T, list[Round]]:
    """``own()`` here, and the round of every request, by the helpers on ``helpers`` or here
    (``here(i)`` runs request i in this process) once ``own`` is done; each round's result in
    request order. ``meanwhile`` runs here on ``own``'s result right after it, while the
    helpers take rounds (work the caller needs whatever the rounds find; this process then
    takes the rounds still waiting). Warnings (a solver crash in a helper's round, a helper
    lost) are raised here, after the rounds, in request order. ``remote`` is what a helper
    runs (a module-level function: tests stand in for it)."""
    waiting = deque(range(len(requests)))
    done: dict[int, Round] = {}
    said: dict[int, Caught] = {}
    lost: list[str] = []
    stop = threading.Event()

    def serve(channel: str) -> None:
        while not stop.is_set() and waiting and not isolate.ready(channel, POLL_S):
            if not isolate.alive(channel):
                return
        while not stop.is_set():
            try:
                i = waiting.popleft()
            except IndexError:
                return
            r = requests[i]
            timeout = ROUND_GRACE_S + 2 * r.time_limit_s + isolate.GRACE_S
            try:
                got = isolate.call(remote, (r,), timeout, channel)
            except isolate.CallNotLoaded:  # (a cost model a script defined): rounds run here
                got = None
            except isolate.SolverCrash as e:
                lost.append(f"the {channel} process failed a round ({e.reason}); planned it here")
                got = None
            if got is None:  # (or kinds a module registers that the helper cannot import)
                waiting.appendleft(i)
                return
            done[i], said[i] = got

    threads = [threading.Thread(target=serve, args=(c,), daemon=True) for c in helpers]
    for t in threads:
        t.start()
    try:
        mine = own()
        if meanwhile is not None:  # (first: the helpers take rounds meanwhile)
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
    for i in range(len(requests)):  # a round a helper gave back after this process finished
        if i not in done:
            done[i] = here(i)
    for message in lost:
        warnings.warn(message, isolate.SolverCrashWarning, stacklevel=2)
    for i in sorted(said):
        for category, message in said[i]:
            warnings.warn(message, category, stacklevel=2)
    return mine, [done[i] for i in range(len(requests))]
