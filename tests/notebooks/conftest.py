"""Fixtures for running the notebooks: the repository paths and a Voila server on localhost.

The server is started the way a user would (``voila NOTEBOOK --no-browser``), bound to
127.0.0.1 on a free port, with Jupyter's config, data and runtime folders redirected into the
test's temporary folder so that neither the user's Jupyter setup nor the test leak into each
other. It is stopped (and its kernel with it) when the test ends.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def chromium_path() -> str | None:
    """The system Chromium (never a browser Playwright would download); ``$SPINDLE_CHROMIUM``
    names another one, and set empty simulates a machine without any."""
    override = os.environ.get("SPINDLE_CHROMIUM")
    if override is not None:
        return override if override and os.access(override, os.X_OK) else None
    for candidate in (*CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jupyter_env(tmp: Path) -> dict[str, str]:
    """The environment for kernels and servers: private Jupyter folders, no GUI backends."""
    env = dict(os.environ)
    for var, sub in (
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
        ("MPLCONFIGDIR", "mpl"),
    ):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(tmp / sub)
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    return env


@pytest.fixture
def chromium() -> str:
    """The system Chromium's path; skips the test when there is none or no Playwright."""
    path = chromium_path()
    if path is None:
        pytest.skip("no system Chromium (install it: apt-get install chromium)")
    if not has_module("playwright"):
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    return path


@dataclass(frozen=True)
class VoilaServer:
    url: str
    log: Path


@pytest.fixture
def voila_server(tmp_path: Path) -> Iterator[callable]:
    """``start(notebook) -> VoilaServer``; every server started is stopped at teardown."""
    if not has_module("voila"):
        pytest.skip("voila is not installed (pip install -e '.[dev]')")
    procs: list[subprocess.Popen] = []

    def start(notebook: Path, ready_timeout_s: float = 60.0) -> VoilaServer:
        port = free_port()
        log = tmp_path / f"voila-{port}.log"
        cmd = [
            sys.executable, "-m", "voila", str(notebook),
            "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
        ]  # fmt: skip
        with log.open("w") as fh:
            proc = subprocess.Popen(
                cmd,
                cwd=notebook.parent,
                env=jupyter_env(tmp_path / "jupyter"),
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"voila exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                # any HTTP answer means the server is up; the page itself runs the notebook
                urllib.request.urlopen(url + "static/", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"voila did not start in {ready_timeout_s}s:\n{log.read_text()}")
                time.sleep(0.2)
        return VoilaServer(url, log)

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernel it started
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
