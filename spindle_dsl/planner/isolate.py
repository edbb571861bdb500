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
problem. One worker is kept per process and reused, so its start-up (importing python-mip,
about 0.2 s) is paid once, and ``warm_up()`` lets the CLI start it while the spec compiles.

Protocol: two pipes handed to the child by descriptor, carrying pickles
(``multiprocessing.connection.Connection`` framing); the child's stdout goes to /dev/null
(CBC logs there even when asked not to) and its stderr to a temporary file, whose first line
(CBC prints "ERROR while running Cbc. Signal SIGSEGV caught") goes into the error message.
"""

from __future__ import annotations

import atexit
import contextlib
import os
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
    "import sys; from spindle_dsl.planner.isolate import _serve; _serve(*map(int, sys.argv[1:]))"
)
START_TIMEOUT_S = 60.0  # a loaded machine may take seconds to import python-mip
GRACE_S = 2.0  # a solve may overrun its limit (model building, presolve) by limit + this


class SolverCrash(RuntimeError):
    """The solver's process died or hung; ``reason`` says how (for the user's warning)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


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

    def __init__(self) -> None:
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the child)
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            dict.fromkeys([package_root, *(p for p in sys.path if p)])
        )
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(req_r), str(res_w)],
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
        global _crashes
        _crashes += 1
        return SolverCrash(f"the solver process {_exit_reason(code)} ({what}){detail}")

    def call(self, fn: Callable[..., T], args: tuple, timeout_s: float) -> T:
        if not self.ready:
            if not self.results.poll(START_TIMEOUT_S):
                raise self._died(f"not ready after {START_TIMEOUT_S:.0f} s")
            try:
                self.results.recv()  # the child's "ready"
            except (EOFError, OSError):
                raise self._died("at start-up") from None
            self.ready = True
        try:
            self.requests.send((fn, args))
        except (BrokenPipeError, OSError):
            raise self._died("before the solve was sent") from None
        try:
            if not self.results.poll(timeout_s):
                raise self._died(f"no answer within {timeout_s:.1f} s")
            ok, value = self.results.recv()
        except (EOFError, OSError):
            raise self._died("while solving") from None
        if not ok:  # a Python exception in the child: the solve failed, the process is fine
            raise SolverCrash(f"the solve raised {value}")
        return value

    def alive(self) -> bool:
        return self.proc.poll() is None and not self.requests.closed

    def close(self) -> None:
        for c in (self.requests, self.results):
            if not c.closed:
                c.close()
        if self.proc.poll() is None:  # closing its input ends the child's loop
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


_lock = threading.Lock()
_worker: _Worker | None = None
_crashes = 0


def crash_count() -> int:
    """How many times a worker died or hung in this process: callers compare it before and
    after a stage to stop calling a solver that has just crashed."""
    return _crashes


def _get() -> _Worker:
    global _worker, _crashes
    if _worker is None or not _worker.alive():
        try:
            _worker = _Worker()
        except OSError as e:  # no interpreter to run, no pipes or processes left
            _worker = None
            _crashes += 1
            raise SolverCrash(f"could not start the solver process ({e})") from e
    return _worker


def warm_up() -> None:
    """Start the worker now (it imports while the caller does other work); idempotent.
    A worker that cannot start is reported by the first ``call``, as a ``SolverCrash``."""
    with _lock, contextlib.suppress(SolverCrash):
        _get()


def call(fn: Callable[..., T], args: tuple, timeout_s: float) -> T:
    """``fn(*args)`` in the worker process; ``SolverCrash`` if it dies or exceeds the time.

    ``fn`` and ``args`` must pickle (``fn`` a module-level function importable in a fresh
    interpreter with the caller's ``sys.path``).
    """
    with _lock:
        return _get().call(fn, args, timeout_s)


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
    """Stop the worker (also done at exit)."""
    global _worker
    with _lock:
        if _worker is not None:
            _worker.close()
            _worker = None


atexit.register(shutdown)


def _serve(req_fd: int, res_fd: int) -> None:
    """The child's loop: answer ``(fn, args)`` requests until the parent closes the pipe."""
    requests = Connection(req_fd, writable=False)
    results = Connection(res_fd, readable=False)
    import mip  # noqa: F401  (import the solver before saying ready: calls then start at once)

    results.send("ready")
    while True:
        try:
            fn, args = requests.recv()
        except (EOFError, OSError):
            return
        started = time.perf_counter()
        try:
            out: tuple[bool, Any] = (True, fn(*args))
        except Exception as e:  # reported to the parent, which treats it as a failed solve
            out = (False, f"{type(e).__name__}: {e} after {time.perf_counter() - started:.2f} s")
        results.send(out)
