"""Which MILP solver the planner drives through python-mip, and how its models are made.

python-mip speaks to two open-source solvers: CBC, bundled with python-mip, and HiGHS,
through the ``highspy`` package. CBC kills the planning process now and then with a native
crash (SIGSEGV, then SIGABRT from its own handler, in ``CglPreProcess::postProcess`` after a
time-limited solve of the global wave MILP), which no Python ``try`` can catch, and it can
also overrun its time limit by seconds. In the crash trials (``bench/solver_trials.py``)
CBC killed 3 of 40 in-process trial processes and HiGHS none of 60, and HiGHS plans as well
(``bench/plan_quality.py --solvers highs,cbc``), deterministically where CBC's plans vary
run to run. So HiGHS is the default and CBC stays selectable (``spindle plan --solver cbc``,
or ``SPINDLE_SOLVER=cbc``).

Independently of the solver, MILPs run in a separate worker process by default (``isolate``):
a native crash or hang then costs one solve, and planning goes on with the best plan found
so far plus a warning. The worker starts once per process (overlapped with compiling the
spec in the CLI), and after that a plan pays only for its transfers to and from it.
``SPINDLE_SOLVER_ISOLATE=0`` solves in-process instead (for profiling).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

import mip

from spindle_dsl.errors import PlanError

SOLVERS: tuple[str, ...] = ("highs", "cbc")
SOLVER_ENV = "SPINDLE_SOLVER"
ISOLATE_ENV = "SPINDLE_SOLVER_ISOLATE"
HIGHS_ADVICE = (
    'install it with: pip install "highspy>=1.9,<1.15" (python-mip 2.0 calls the HiGHS C API, '
    "which highspy 1.15 and later no longer export), or choose --solver cbc"
)
_MIP_NAMES = {"highs": "HiGHS", "cbc": "CBC"}  # python-mip's solver_name (case-insensitive)


@dataclass(frozen=True)
class SolverChoice:
    """The solver every MILP of one planning call uses.

    ``isolated``: solve in the worker process (a crash degrades to a warning).
    ``notes``: what the user should know about the choice (e.g. a fallback to CBC).
    ``host``: the helper process it solves in, unisolated (its caller is isolated from it).
    """

    name: str = "highs"
    isolated: bool = True
    notes: tuple[str, ...] = ()
    # where it solves in-process, when that process is itself a helper another one watches
    # (``planner.search.helpers``: a crash there costs the round, which its caller re-plans)
    host: str = ""

    @property
    def label(self) -> str:
        if self.host:
            return f"{self.name} (in {self.host})"
        return f"{self.name}{'' if self.isolated else ' (in-process)'}"


@cache
def highs_available() -> bool:
    """Whether python-mip can load HiGHS here (highspy installed, C API exported)."""
    if importlib.util.find_spec("highspy") is None or importlib.util.find_spec("mip.highs") is None:
        return False  # no HiGHS, or a python-mip too old to drive it
    log = logging.getLogger("mip.highs")
    disabled, log.disabled = log.disabled, True  # python-mip logs its own failure loudly
    try:
        import mip.highs as mh

        return bool(mh.has_highs)
    except Exception:  # a broken highspy is the same as none for choosing a solver
        return False
    finally:
        log.disabled = disabled


def _flag(value: str | None, default: bool) -> bool:
    if value is None or value.strip() == "":
        return default
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise PlanError(f"{ISOLATE_ENV}={value!r}: expected 1 or 0")


def choose_solver(name: str | None = None, isolated: bool | None = None) -> SolverChoice:
    """Resolve the solver: ``name``, else ``$SPINDLE_SOLVER``, else HiGHS (CBC if HiGHS is
    missing, with a note). Raises ``PlanError`` for an unknown name, or for HiGHS asked for
    by name when it cannot be loaded."""
    asked = name if name is not None else os.environ.get(SOLVER_ENV) or None
    iso = isolated if isolated is not None else _flag(os.environ.get(ISOLATE_ENV), True)
    if asked is None:
        if highs_available():
            return SolverChoice("highs", iso)
        note = f"HiGHS is not available, planning with CBC; {HIGHS_ADVICE.split(', or')[0]}"
        return SolverChoice("cbc", iso, (note,))
    key = asked.strip().lower()
    if key not in SOLVERS:
        raise PlanError(f"unknown solver '{asked}' (choose from {', '.join(SOLVERS)})")
    if key == "highs" and not highs_available():
        raise PlanError(f"the HiGHS solver is not available; {HIGHS_ADVICE}")
    return SolverChoice(key, iso)


def new_model(label: str, solver: str) -> mip.Model:
    """A quiet, single-threaded minimisation model on ``solver`` ("highs" or "cbc").

    One thread: the planner's machines are shared, and both solvers' parallel modes make
    results depend on timing; quiet: the CLI's output is the plan, not solver logs.
    """
    model = mip.Model(label, sense=mip.MINIMIZE, solver_name=_MIP_NAMES[solver])
    model.verbose = 0
    model.threads = 1
    return model


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while python-mip models are built and solved.

    A HiGHS model frees itself in ``__del__`` through cffi, which takes the lock cffi also
    holds while it parses a C type the first time it meets it; a model is in a reference
    cycle, so the collector frees it at whatever allocation comes next, and one that comes
    inside such a parse deadlocks the process (seen in a planning helper: a re-split's
    ``optimize`` parsing ``double*`` while a collection freed an earlier model). With the
    collector paused while any model is live, collections happen between solves, where no
    cffi lock is held. Usable as a decorator."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Silence file descriptor 1: CBC's LP solver logs there even at log level 0."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real stdout (some notebook kernels): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


__all__ = [
    "ISOLATE_ENV",
    "SOLVERS",
    "SOLVER_ENV",
    "SolverChoice",
    "choose_solver",
    "collector_paused",
    "highs_available",
    "new_model",
    "quiet_stdout",
]
