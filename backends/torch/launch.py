"""``--nproc N``: spawn N local worker processes, watch them, and leave no orphans.

The parent hosts the rendezvous store on a free loopback port (the OS picks it, so two runs on
one machine never race for a port), pickles the job into a private run folder and starts the
workers (``worker_command``: the parent's own ``spindle_dsl``, whatever the current directory
holds). Nothing a local run opens listens beyond loopback: torch.distributed authenticates no
peer, so the store's socket is bound to 127.0.0.1 here (``loopback_store``) and the workers'
gloo and NCCL sockets are pinned to the loopback interface (``_worker_env``). Then it watches:

- a worker that exits non-zero has failed; the parent waits a moment for the others' exits,
  picks the root cause (a rank killed by a signal, or one whose error is not merely "my peer
  went away"), stops every other rank and raises ``rank R failed: <cause>``;
- each worker touches a heartbeat file at every phase of a step; when the oldest heartbeat is
  older than the hang timeout, that rank is reported as hung and every rank is stopped (the
  workers' own collective timeout, a little longer, is the second line of defence);
- workers die with the parent (``PR_SET_PDEATHSIG``), and the parent kills what is left in a
  ``finally``, so no process outlives a run however it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spindle_dsl.atomic import write_atomic
from spindle_dsl.errors import ExecutionError, SpindleError
from spindle_dsl.plan.model import ClusterRef

from ..base import RunResult

# Phrases in the error of a rank that failed only because a peer failed first.
_SECONDARY = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "pair closure",
    "timed out",
    "timeout",
    "socket",
    "nccl",
    "unbound_buffer",
)
_GRACE_S = 1.0  # after a first failure, time allowed for the other exits to arrive
_TERM_S = 3.0  # after SIGTERM, time before SIGKILL


_DETAIL = "\n--- traceback ---\n"  # separates a worker's error summary from its traceback


@dataclass(frozen=True)
class Failure:
    rank: int
    cause: str
    secondary: bool  # merely a consequence of another rank's failure
    detail: str = ""  # the traceback of an unexpected Python error


# Seconds a worker may take to start (import torch, join the process group) before it counts as
# hung, when --hang-timeout is shorter: 4 workers on 2 busy cores took 14-30 s to start here.
START_TIMEOUT_S = 120.0


class Heartbeat:
    """A worker's last sign of life: a small file rewritten at every phase of a step."""

    def __init__(self, path: Path):
        self.path = path
        try:  # what the parent wrote first ("starting") is covered too
            self._width = path.stat().st_size
        except OSError:
            self._width = 0
        self._fd: int | None = None

    def beat(self, what: str) -> None:
        # Overwritten in place through one descriptor held open, never truncated: on ext4 a
        # truncate-then-write pushes the data to disk at close (auto_da_alloc), and an open
        # and close per beat is two more system calls at some twenty beats a step. Spaces
        # cover a longer previous text; the write moves the file's modified time, which the
        # parent's watchdog reads.
        data = what.encode().ljust(self._width)
        self._width = len(data)
        # OSError: the run folder went away, so the parent is gone and PDEATHSIG follows.
        with contextlib.suppress(OSError):
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.pwrite(self._fd, data, 0)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    os.setpgrp()  # a terminal's Ctrl-C reaches the parent only; it stops the workers itself


# A worker must import the very spindle_dsl its parent runs. ``python -m`` (and ``-c``) put the
# current directory first on sys.path, so from a checkout's root the source folder
# ``spindle_dsl/`` would shadow an installed package, and it lacks ``spindle_dsl.backends``
# (setup.py maps ``backends/`` into the package only when installing). The worker therefore
# starts with ``-c``, takes the parent's sys.path as its own, and only then imports.
_BOOT = (
    "import json, os, sys; sys.path[:] = json.loads(os.environ['SPINDLE_SYS_PATH']); "
    "from spindle_dsl.backends.torch.launch import worker_entry; worker_entry()"
)


def worker_command(run_dir: Path) -> list[str]:
    """The command line of a spawned worker (its environment carries the parent's sys.path)."""
    return [sys.executable, "-c", _BOOT, str(run_dir)]


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface (``lo`` on Linux, ``lo0`` on macOS), or
    None where none is found (the backends then pick their interface themselves)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def loopback_store() -> Any:
    """The run's rendezvous store: a ``TCPStore`` server listening on 127.0.0.1 alone.

    Given a host, TCPStore's server still binds every interface (IPv4 and IPv6), and the store
    authenticates nobody while the run trusts what it holds (the rendezvous, the process
    groups' addresses). The workers of a local run are all on this machine, so the socket is
    bound to loopback here and handed over as ``master_listen_fd``; the store then owns it."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    port, fd = sock.getsockname()[1], sock.detach()  # the store closes it: Python must not
    ours = os.fstat(fd).st_ino
    try:
        return dist.TCPStore(
            "127.0.0.1", port, None, True, wait_for_workers=False, master_listen_fd=fd
        )
    except BaseException:
        # a failed store may or may not have closed it (it depends on the server's backend)
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == ours:
                os.close(fd)
        raise


def _worker_env(rank: int, world: int, port: int, run_dir: Path) -> dict[str, str]:
    """A spawned worker's environment: the parent's, with its rank, the store's address and
    the loopback interface for gloo's and NCCL's sockets (set whatever the parent's
    environment says: every peer of a local run is on this machine)."""
    env = dict(os.environ)
    path = [p for p in sys.path if p]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        PYTHONPATH=os.pathsep.join(path),
        SPINDLE_SYS_PATH=json.dumps(sys.path),
        SPINDLE_RUN_DIR=str(run_dir),
    )
    loopback = loopback_interface()
    if loopback is not None:
        # gloo takes an interface's name; NCCL a prefix, unless it starts with '='
        env.update(GLOO_SOCKET_IFNAME=loopback, NCCL_SOCKET_IFNAME=f"={loopback}")
    return env


def _cause(rank: int, code: int, run_dir: Path) -> Failure:
    err = run_dir / f"error-{rank}"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return Failure(rank, f"killed by signal {name}", False)
    if err.exists():
        summary, _, detail = err.read_text().partition(_DETAIL)
        summary = summary.strip() or f"exited with code {code}"
        return Failure(rank, summary, any(s in summary.lower() for s in _SECONDARY), detail)
    return Failure(rank, f"exited with code {code}", False)


def _stop(procs: list[subprocess.Popen]) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + _TERM_S
    for p in alive:
        try:
            p.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def spawn(job, nproc: int, *, hang_timeout_s: float, poll_s: float = 0.1) -> RunResult:
    """Run ``job`` on ``nproc`` local worker processes and return rank 0's result."""
    if nproc < 1:
        raise ExecutionError(f"--nproc must be at least 1, got {nproc}")
    run_dir = Path(tempfile.mkdtemp(prefix="spindle-run-"))
    procs: list[subprocess.Popen] = []
    try:
        try:
            write_atomic(run_dir / "job.pkl", pickle.dumps(job))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise ExecutionError(
                f"cannot hand the job to worker processes: {exc} (datasets must be picklable: "
                f"define their classes in an importable module)"
            ) from None
        store = loopback_store()  # the parent hosts it; workers import torch anyway
        beats = [run_dir / f"heartbeat-{r}" for r in range(nproc)]
        for r in range(nproc):
            beats[r].write_text("starting")
            procs.append(
                subprocess.Popen(
                    worker_command(run_dir),
                    env=_worker_env(r, nproc, store.port, run_dir),
                    preexec_fn=_die_with_parent,
                )
            )
        _watch(procs, beats, run_dir, hang_timeout_s, poll_s)
        result_file = run_dir / "result.pkl"
        if not result_file.exists():
            raise ExecutionError("rank 0 finished without a result")
        return pickle.loads(result_file.read_bytes())
    finally:
        _stop(procs)
        shutil.rmtree(run_dir, ignore_errors=True)


def _watch(
    procs: list[subprocess.Popen], beats: list[Path], run_dir: Path, hang_s: float, poll_s: float
) -> None:
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        if any(c not in (None, 0) for c in codes):
            time.sleep(_GRACE_S)
            codes = [p.poll() for p in procs]
            failures = [_cause(r, c, run_dir) for r, c in enumerate(codes) if c not in (None, 0)]
            root = next((f for f in failures if not f.secondary), failures[0])
            others = [r for r in range(len(procs)) if r != root.rank]
            _stop(procs)
            detail = f"\n{root.detail.rstrip()}" if root.detail and not root.secondary else ""
            raise ExecutionError(
                f"rank {root.rank} failed: {root.cause}{detail}\n"
                f"stopped ranks {', '.join(map(str, others))}"
            )
        now = time.time()
        # a worker that has not beaten yet is still importing torch and joining the group,
        # which a busy machine can stretch well past a wave's hang timeout
        start_s = max(hang_s, START_TIMEOUT_S)
        ages = []
        for r, (p, b) in enumerate(zip(procs, beats, strict=True)):
            if p.poll() is None:
                try:
                    ages.append((now - b.stat().st_mtime, r, b.read_text().strip()))
                except OSError:
                    ages.append((0.0, r, "?"))
        late = [a for a in ages if a[0] > (start_s if a[2] == "starting" else hang_s)]
        if late:
            age, r, what = max(late)
            _stop(procs)
            raise ExecutionError(
                f"rank {r} failed: hung, no progress for {age:.0f} s (last: {what}); "
                f"stopped every rank (raise --hang-timeout if a wave legitimately takes longer)"
            )
        time.sleep(poll_s)


@dataclass(frozen=True)
class LaunchTopology:
    """The processes a launcher (torchrun) started: ``world`` in all, ``per_node`` on each
    node (``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``)."""

    world: int
    per_node: int

    @property
    def nodes(self) -> int:
        return self.world // self.per_node


def launched_topology(env: Mapping[str, str] | None = None) -> LaunchTopology | None:
    """The launch's topology, or None where the launcher does not say (no LOCAL_WORLD_SIZE:
    the check below then cannot run). Nodes of different sizes are an error."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env or "LOCAL_WORLD_SIZE" not in env:
        return None
    try:
        world, per_node = int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])
    except ValueError:
        raise ExecutionError("WORLD_SIZE and LOCAL_WORLD_SIZE must be integers") from None
    if world < 1 or per_node < 1 or world % per_node:
        raise ExecutionError(
            f"the launcher started {world} processes, {per_node} on this node: the planner "
            f"assumes nodes of one size, so launch the same --nproc-per-node on every node"
        )
    return LaunchTopology(world, per_node)


def check_topology(cluster: ClusterRef, launched: LaunchTopology, what: str = "the plan") -> None:
    """Refuse to run a plan made for another node layout than the one launched: its placement
    keeps groups inside nodes and its prices assume which links are NVLink and which the
    network, so a silent run would train fine but not as planned."""
    plan_nodes = -(-cluster.devices // cluster.devices_per_node)
    if (cluster.devices, cluster.devices_per_node) == (launched.world, launched.per_node):
        return
    raise ExecutionError(
        f"{what} is for {cluster.devices} devices, {cluster.devices_per_node} per node "
        f"({plan_nodes} nodes), but torchrun started {launched.world} processes, "
        f"{launched.per_node} per node ({launched.nodes} nodes): launch it with "
        f"`torchrun --nnodes {plan_nodes} --nproc-per-node {cluster.devices_per_node} ...`, or "
        f"plan for this launch (`spindle plan SPEC --devices {launched.world} "
        f"--devices-per-node {launched.per_node}`, or `spindle train` without --plan)"
    )


def worker_main(run_dir: Path) -> int:
    """The body of a spawned worker: run the job, leave a result or an error file."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    heartbeat = Heartbeat(run_dir / f"heartbeat-{rank}")
    try:
        import torch
        import torch.distributed as dist

        from .worker import run_rank

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        job = pickle.loads((run_dir / "job.pkl").read_bytes())
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            None,
            False,
            timeout=__import__("datetime").timedelta(seconds=job.config.collective_timeout_s),
        )
        local = int(os.environ["LOCAL_RANK"])
        runner = getattr(job, "run_rank", None)  # a job that runs itself (``spindle profile``)
        if callable(runner):
            result = runner(rank, world, local, store=store, heartbeat=heartbeat.beat)
        else:
            result = run_rank(job, rank, world, local, store=store, heartbeat=heartbeat.beat)
        if rank == 0:
            write_atomic(run_dir / "result.pkl", pickle.dumps(result))
        return 0
    except BaseException as exc:  # the parent reports it; a worker prints nothing itself
        if isinstance(exc, SpindleError):
            text = exc.render()
        else:
            text = f"{type(exc).__name__}: {exc}{_DETAIL}{traceback.format_exc()}"
        with contextlib.suppress(OSError):
            write_atomic(run_dir / f"error-{rank}", text)
        return 1


def worker_entry() -> None:
    """A spawned worker's main: ``sys.argv[1]`` is the run folder."""
    code = worker_main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: torch's atexit hooks can abort after a failure


if __name__ == "__main__":
    worker_entry()
