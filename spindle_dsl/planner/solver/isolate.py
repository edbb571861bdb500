"""Run native solver calls in a worker process, so that a crash costs one solve, not the CLI.

A segfault inside a C library kills the whole Python process: no ``except`` sees it, and a
user gets a core dump instead of a plan. ``call(fn, args, timeout_s)`` therefore runs
``fn(*args)`` in a long-lived child interpreter and returns its result; if the child dies
(any signal) or does not answer within ``timeout_s``, ``SolverCrash`` is raised, the child is
reaped, and the next call starts a fresh one. Callers catch ``SolverCrash`` and keep the best
result they had.

Why a plain ``subprocess`` rather than ``multiprocessing``: a ``spawn`` child re-imports the
caller's ``__main__``, which runs the top-level code of user scripts without a main guard,
and ``fork`` copies a parent's threads' locks (a notebook kernel, a HiGHS thread pool) into
a child that may then deadlock. A fresh interpreter running only ``_serve`` has neither
problem. One worker is kept per process and reused, so its start-up (importing this package,
python-mip and HiGHS' library) is paid once, and ``warm_up()`` lets the CLI start it while
the spec compiles (``after=``: once the planner's helpers have started, so that one child at
a time imports beside the planner).

Channels: each name (``SOLVER`` by default) has its own worker, lock and crash count, so a
caller can keep a second worker busy beside the first: ``planner.search.helpers`` plans the
lever search's runner-up settings on channels of their own while this process plans its own setting.
``warm_up(channel, prepare=...)`` names a ``module:function`` the child runs before it says
ready (the imports its calls need).

Protocol: two pipes handed to the child by descriptor, carrying pickles
(``multiprocessing.connection.Connection`` framing); the child's stdout goes to /dev/null
(CBC logs there even when asked not to) and its stderr to a temporary file, whose first line
(CBC prints "ERROR while running Cbc. Signal SIGSEGV caught") goes into the error message.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
# the child's program: ``python -m`` would import this module twice (once with its package)
_CHILD = (
    "import sys; from spindle_dsl.planner.solver.isolate import _serve; "
    "_serve(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])"
)
SOLVER = "solver"  # the channel of the solver calls
START_TIMEOUT_S = 60.0  # a loaded machine may take seconds to import python-mip
GRACE_S = 2.0  # a solve may overrun its limit (model building, presolve) by limit + this


class SolverCrash(RuntimeError):
    """The solver's process died or hung; ``reason`` says how (for the user's warning)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class CallNotLoaded(SolverCrash):
    """A call that could not be pickled here or unpickled in the worker (its function or an
    argument is defined where a fresh interpreter cannot import it, such as a script's
    ``__main__``); the worker is fine."""


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class _Worker:
    """One child interpreter answering calls over a pair of pipes."""

    def __init__(self, channel: str = SOLVER, prepare: str | None = None) -> None:
        self.channel = channel
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the child)
        package_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            dict.fromkeys([package_root, *(p for p in sys.path if p)])
        )
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(req_r), str(res_w), *filter(None, [prepare])],
                pass_fds=(req_r, res_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self.stderr,
                env=env,
                close_fds=True,
            )
        finally:
            os.close(req_r)
            os.close(res_w)
        self.requests = Connection(req_w, readable=False)
        self.results = Connection(res_r, writable=False)
        self.ready = False

    def _died(self, what: str) -> SolverCrash:
        """Reap the child and describe its end (its stderr's first line included)."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self.stderr.seek(0)
        first = next(
            (
                ln.strip()
                for ln in self.stderr.read(4096).decode(errors="replace").splitlines()
                if ln.strip()
            ),
            "",
        )
        detail = f" ({first})" if first else ""
        self.close()
        _crashes[self.channel] = _crashes.get(self.channel, 0) + 1
        return SolverCrash(f"the {self.channel} process {_exit_reason(code)} ({what}){detail}")

    def handshake(self, wait_s: float) -> bool:
        """Whether the child has said ready, waiting up to ``wait_s`` for it; ``EOFError`` or
        ``OSError`` where it died starting."""
        if not self.ready:
            if not self.results.poll(wait_s):
                return False
            self.results.recv()  # the child's "ready"
            self.ready = True
        return True

    def call(self, fn: Callable[..., T], args: tuple, timeout_s: float) -> T:
        try:
            if not self.handshake(START_TIMEOUT_S):
                raise self._died(f"not ready after {START_TIMEOUT_S:.0f} s")
        except (EOFError, OSError):
            raise self._died("at start-up") from None
        try:
            payload = pickle.dumps((fn, args))
        except Exception as e:  # (a lambda, a local class): nothing was sent
            raise CallNotLoaded(f"the call cannot be sent: {type(e).__name__}: {e}") from None
        try:
            self.requests.send_bytes(payload)
        except (BrokenPipeError, OSError):
            raise self._died("before the solve was sent") from None
        try:
            if not self.results.poll(timeout_s):
                raise self._died(f"no answer within {timeout_s:.1f} s")
            ok, value = self.results.recv()
        except (EOFError, OSError):
            raise self._died("while solving") from None
        if ok is None:
            raise CallNotLoaded(f"the {self.channel} process could not load the call: {value}")
        if not ok:  # a Python exception in the child: the solve failed, the process is fine
            raise SolverCrash(f"the solve raised {value}")
        return value

    def alive(self) -> bool:
        return self.proc.poll() is None and not self.requests.closed

    def close(self) -> None:
        self.hang_up()
        self.reap()

    def hang_up(self) -> None:
        """Close the pipes: the child's loop ends (``_serve``)."""
        for c in (self.requests, self.results):
            if not c.closed:
                c.close()

    def reap(self) -> None:
        """Wait for the child to end (killed after 2 s), once its pipes are closed."""
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


_guard = threading.Lock()  # over the two tables below
_locks: dict[str, threading.Lock] = {}  # one per channel: a worker answers one call at a time
_workers: dict[str, _Worker] = {}
_crashes: dict[str, int] = {}
_deferred: dict[str, threading.Thread] = {}  # warm-ups waiting for other workers to start
POLL_S = 0.02  # how often a deferred warm-up looks whether the workers it waits for are up


def crash_count(channel: str = SOLVER) -> int:
    """How many times a worker of ``channel`` died or hung in this process: callers compare it
    before and after a stage to stop calling a solver that has just crashed."""
    return _crashes.get(channel, 0)


def _lock(channel: str) -> threading.Lock:
    with _guard:
        return _locks.setdefault(channel, threading.Lock())


def _get(channel: str, prepare: str | None = None) -> _Worker:
    """``channel``'s worker, started if it has none or it died (under the channel's lock)."""
    worker = _workers.get(channel)
    if worker is None or not worker.alive():
        if worker is not None:  # (ended from outside, ``abandon``: its pipes and file go too)
            worker.close()
        try:
            worker = _workers[channel] = _Worker(channel, prepare)
        except OSError as e:  # no interpreter to run, no pipes or processes left
            _workers.pop(channel, None)
            _crashes[channel] = _crashes.get(channel, 0) + 1
            raise SolverCrash(f"could not start the {channel} process ({e})") from e
    return worker


def warm_up(channel: str = SOLVER, prepare: str | None = None, after: tuple[str, ...] = ()) -> None:
    """Start ``channel``'s worker now (it imports while the caller does other work), running
    ``prepare`` (``module:function``) before it says ready; idempotent. A worker that cannot
    start is reported by the first ``call``, as a ``SolverCrash``.

    ``after``: channels whose workers are starting too; this one starts once they are up
    (from a thread, so the caller goes on at once), so that no more than one child imports
    beside the caller at a time: on a 2-core machine the planner's helper and the solver
    process importing at once slow the lever search beside them more than one after the
    other. A call that needs the worker before then starts it itself."""
    if after:
        with _guard:
            if channel in _deferred or alive(channel):
                return
            waiting = _deferred[channel] = threading.Thread(
                target=_warm_after, args=(channel, prepare, after), daemon=True
            )
        waiting.start()
        return
    with _lock(channel), contextlib.suppress(SolverCrash):
        _get(channel, prepare)


def _warm_after(channel: str, prepare: str | None, after: tuple[str, ...]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    for other in after:
        while not _up(other) and time.monotonic() < deadline:
            time.sleep(POLL_S)  # (not holding its lock: a caller may want it meanwhile)
    warm_up(channel, prepare)
    with _guard:
        _deferred.pop(channel, None)


def _up(channel: str) -> bool:
    """Whether ``channel``'s worker has finished starting (``ready``), or is in a call (it
    has started, or the call waits for it), or there is none to wait for."""
    return not alive(channel) or ready(channel, 0.0) or _lock(channel).locked()


def alive(channel: str) -> bool:
    """Whether ``channel`` has a worker process still running."""
    worker = _workers.get(channel)
    return worker is not None and worker.alive()


def ready(channel: str, wait_s: float) -> bool:
    """Whether ``channel``'s worker (started by ``warm_up``) has said ready, waiting up to
    ``wait_s`` for it; False where it has none, is busy with a call or died starting."""
    lock = _lock(channel)
    if not lock.acquire(blocking=False):
        return False
    try:
        worker = _workers.get(channel)
        if worker is None or not worker.alive():
            return False
        try:
            return worker.handshake(wait_s)
        except (EOFError, OSError):
            return False
    finally:
        lock.release()


def call(fn: Callable[..., T], args: tuple, timeout_s: float, channel: str = SOLVER) -> T:
    """``fn(*args)`` in ``channel``'s worker process; ``SolverCrash`` if it dies or exceeds the
    time.

    ``fn`` and ``args`` must pickle (``fn`` a module-level function importable in a fresh
    interpreter with the caller's ``sys.path``).
    """
    with _lock(channel):
        return _get(channel).call(fn, args, timeout_s)


def abandon(channel: str) -> None:
    """End ``channel``'s worker now, busy or not, for work nobody waits for any more: a call
    in flight raises ``SolverCrash`` and the next call starts a fresh worker. The worker ends
    its own workers first (``_end_on_sigterm``: work that plans starts helpers of its own)."""
    worker = _workers.get(channel)
    if worker is not None and worker.proc.poll() is None:
        worker.proc.terminate()


def _end_on_sigterm(signum: int, _frame: object) -> None:
    """(in a worker) Kill this worker's own workers, then end as SIGTERM ends a process."""
    for worker in list(_workers.values()):
        if worker.proc.poll() is None:
            worker.proc.kill()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class SolverCrashWarning(RuntimeWarning):
    """A solver process died or hung; planning went on with the best plan found before."""


def call_or_warn(fn: Callable[..., T], args: tuple, time_limit_s: float, what: str) -> T | None:
    """``call`` for a solve limited to ``time_limit_s``: None and a ``SolverCrashWarning``
    (saying which solve, and how it ended) if the worker dies or hangs."""
    try:
        return call(fn, args, 2 * time_limit_s + GRACE_S)
    except SolverCrash as e:
        warnings.warn(
            f"solver failure in the {what}: {e.reason}; kept the best plan found before it",
            SolverCrashWarning,
            stacklevel=3,
        )
        return None


def shutdown() -> None:
    """Stop every channel's worker (also done at exit): all hung up first, so that they end
    side by side, then each reaped."""
    stopped = []
    for channel in list(_workers):
        with _lock(channel):
            worker = _workers.pop(channel, None)
            if worker is not None:
                worker.hang_up()
                stopped.append(worker)
    for worker in stopped:
        worker.reap()


atexit.register(shutdown)


def _serve(req_fd: int, res_fd: int, prepare: str | None = None) -> None:
    """The child's loop: answer ``(fn, args)`` requests until the parent closes the pipe."""
    requests = Connection(req_fd, writable=False)
    results = Connection(res_fd, readable=False)
    signal.signal(signal.SIGTERM, _end_on_sigterm)
    # import the solver before saying ready, so that calls start at once: python-mip, and
    # HiGHS' module, which loads its library where python-mip would on a first model
    import mip

    with contextlib.suppress(ImportError):
        import mip.highs  # noqa: F401

    if prepare:  # a failure here ends the child before it says ready: the call reports it
        module, _, function = prepare.partition(":")
        getattr(importlib.import_module(module), function)()

    results.send("ready")
    while True:
        try:
            payload = requests.recv_bytes()
        except (EOFError, OSError):
            # the parent hung up: end now, without the interpreter's teardown, which a
            # helper holding 1,024-device contexts takes 0.1-0.3 s over while the parent's
            # exit waits for it (``shutdown``); nothing of the child's needs cleaning up
            sys.stderr.flush()
            os._exit(0)
        try:  # a function or argument this interpreter cannot import (a script's class)
            fn, args = pickle.loads(payload)
        except Exception as e:
            results.send((None, f"{type(e).__name__}: {e}"))
            continue
        started = time.perf_counter()
        try:
            out: tuple[bool, Any] = (True, fn(*args))
        except Exception as e:  # reported to the parent, which treats it as a failed solve
            out = (False, f"{type(e).__name__}: {e} after {time.perf_counter() - started:.2f} s")
        results.send(out)
