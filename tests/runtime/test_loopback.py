"""A local multi-process run (``spindle train --nproc``, ``spindle profile --nproc``) listens on
loopback alone.

torch.distributed authenticates no peer: its store and gloo's sockets trust whoever connects.
The slow tests start a run as a separate process, and while it runs read the listening TCP
sockets of every process of its tree from /proc (each process's socket inodes in
/proc/PID/fd, matched to the LISTEN entries of /proc/PID/net/tcp and tcp6); any listener on
another address than 127.0.0.1 or ::1 fails them. The runs' environment points gloo and NCCL
at a network interface where the machine has one, as a shell set up for multi-node runs
would: a local run must keep to loopback all the same. Two quick tests check the parent's
store alone and the environment the workers are given.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spindle_dsl.backends.torch import launch

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1"}
SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address

SPEC = """
cluster { devices = 2; device = "cpu" }
modality text  { tokens = 8; vocab = 32 }
modality audio { tokens = 6; features = 4 }
encoder ear : transformer(layers = 1, hidden = 16, heads = 2) <- audio
module  lm  : transformer(layers = 2, hidden = 16, heads = 2, causal = true, vocab = 32)
task listen { audio -> ear -> lm; text -> lm; loss = lm; batch = 4 }
"""


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc/PID/task/TID/children); a process
    that ends while it is read is simply not descended into."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:  # the process ended between being listed and being read
            continue
        for task in tasks:
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _address(hex_addr: str) -> str:
    """An address as /proc/net/tcp{,6} writes it (32-bit words in host order) in text."""
    raw = b"".join(bytes.fromhex(hex_addr[i : i + 8])[::-1] for i in range(0, len(hex_addr), 8))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def _listening(pid: int) -> dict[int, str]:
    """socket inode -> ``address:port`` of every listening TCP socket in ``pid``'s network
    namespace (state 0A is LISTEN)."""
    out = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":
                addr, port = fields[1].split(":")
                out[int(fields[9])] = f"{_address(addr)}:{int(port, 16)}"
    return out


def listeners(root: int) -> dict[int, set[str]]:
    """pid -> the ``address:port`` its listening TCP sockets are bound to, for ``root`` and
    every process below it (those that listen on nothing are left out)."""
    table = _listening(root)
    found = {}
    for pid in _tree(root):
        mine = {table[i] for i in _socket_inodes(pid) if i in table}
        if mine:
            found[pid] = mine
    return found


def _network_interface() -> str | None:
    """A non-loopback interface with an IPv4 address, or None where the machine has none."""
    import fcntl  # Linux, as /proc is

    for _, name in socket.if_nameindex():
        if name.startswith("lo"):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
        return name
    return None


def _watch(args: list[str], cwd: Path) -> tuple[int, dict[int, set[str]]]:
    """Run ``spindle ARGS``, reading the listeners of its process tree every 50 ms until it
    ends; returns its pid and everything seen (pid -> addresses)."""
    env = dict(os.environ)
    nic = _network_interface()
    if nic is not None:
        env.update(GLOO_SOCKET_IFNAME=nic, NCCL_SOCKET_IFNAME=nic)
    path = [str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spindle_dsl", *args],
        cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: dict[int, set[str]] = {}
    deadline = time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            for pid, addrs in listeners(proc.pid).items():
                seen.setdefault(pid, set()).update(addrs)
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == 0, err
    return proc.pid, seen


def _check(parent: int, seen: dict[int, set[str]]) -> None:
    """Every listener seen is on loopback, and the reading saw the run's sockets at all: the
    parent's store and both workers' gloo sockets."""
    wide = {pid: sorted(a for a in addrs if a.rsplit(":", 1)[0] not in LOOPBACK)
            for pid, addrs in seen.items()}  # fmt: skip
    assert not any(wide.values()), f"listening beyond loopback: {wide}"
    assert parent in seen and len(seen) >= 3, f"the run's listeners were not all seen: {seen}"


def _skip_without_proc() -> None:
    if sys.platform != "linux" or not Path("/proc/self/net/tcp").is_file():
        pytest.skip("reads listening sockets through /proc (Linux)")


def _bound_to(port: int) -> set[str]:
    """The addresses this process listens on at ``port``."""
    mine = listeners(os.getpid()).get(os.getpid(), set())
    return {a for a in mine if a.endswith(f":{port}")}


def test_the_store_listens_on_loopback_only_and_closes_its_socket() -> None:
    _skip_without_proc()
    store = launch.loopback_store()
    port = store.port
    assert _bound_to(port) == {f"127.0.0.1:{port}"}
    del store
    assert _bound_to(port) == set()


def test_workers_use_the_loopback_interface_whatever_the_environment_says(monkeypatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    loopback = launch.loopback_interface()
    if loopback is None:
        pytest.skip("this machine names no loopback interface")
    env = launch._worker_env(1, 2, 29500, Path("run"))
    assert env["GLOO_SOCKET_IFNAME"] == loopback
    assert env["NCCL_SOCKET_IFNAME"] == f"={loopback}"
    assert env["MASTER_ADDR"] == "127.0.0.1"


@pytest.mark.slow
def test_a_local_training_run_listens_on_loopback_only(tmp_path):
    _skip_without_proc()
    spec = tmp_path / "s.spindle"
    spec.write_text(SPEC)
    args = ["train", str(spec), "--nproc", "2", "--steps", "40", "--no-progress"]
    _check(*_watch(args, tmp_path))


@pytest.mark.slow
def test_profiling_on_local_workers_listens_on_loopback_only(tmp_path):
    _skip_without_proc()
    spec = str(ROOT / "examples" / "tiny_mm.spindle")
    args = ["profile", spec, "--devices", "2", "--nproc", "2", "--points", "2", "--quiet",
            "--out", str(tmp_path / "p.json")]  # fmt: skip
    _check(*_watch(args, tmp_path))
