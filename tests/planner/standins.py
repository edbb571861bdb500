"""Solver stand-ins for the isolation tests: importable by name in the worker process.

The worker is a fresh interpreter that imports the functions it is sent by module and name
(with the test process's ``sys.path``, which holds this folder), so the stand-ins that crash
or hang must live in a module, not inside a test function.
"""

from __future__ import annotations

import os
import signal
import time


def segfault(*_args: object) -> None:
    """Die the way CBC does: SIGSEGV, no Python exception, no cleanup."""
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(60)  # not reached: the signal ends the process


def hang(*_args: object) -> None:
    """Never answer (a solver ignoring its time limit)."""
    time.sleep(3600)


def worker_pid() -> int:
    return os.getpid()


def fail(*_args: object) -> None:
    raise ValueError("a Python error inside the solve")


def tag_round(request):
    """A helper's round that only says which process ran it and at which k."""
    return ("helper", os.getpid(), request.levers.micro_batches), ()


def crash_round(request):
    """A helper dying in a round (a native crash in its solver)."""
    segfault()


def hang_with_a_worker(pid_file: str) -> None:
    """Keep a worker of this worker's own busy (as planning keeps helpers busy), write its
    process id to ``pid_file`` and never answer."""
    import threading

    from spindle_dsl.planner.solver import isolate

    inner = isolate.call(worker_pid, (), 60, "inner")
    threading.Thread(target=isolate.call, args=(hang, (), 3600, "inner"), daemon=True).start()
    time.sleep(0.3)  # (the inner call has been sent)
    with open(pid_file, "w") as f:
        f.write(str(inner))
    hang()
