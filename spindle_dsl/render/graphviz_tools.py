"""Running Graphviz's ``dot`` program, and what to do when it is not installed.

The ``graphviz`` Python package only writes DOT text; turning it into SVG, PNG or PDF needs the
``dot`` program, which pip cannot install. Without it, commands must still write the DOT source
(it can be rendered later or pasted into an online viewer) and say exactly what is missing and
how to get it, instead of failing with the package's generic ExecutableNotFound.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import graphviz

from spindle_dsl.atomic import write_atomic
from spindle_dsl.errors import Diagnostic, SpindleError

DOT_FORMATS = ("svg", "png", "pdf")

INSTALL_HINT = (
    "install Graphviz, which provides it: `apt-get install graphviz` (Debian/Ubuntu), "
    "`dnf install graphviz` (Fedora), `brew install graphviz` (macOS), "
    "`conda install -c conda-forge graphviz`, or see https://graphviz.org/download/"
)


class DotMissingError(SpindleError):
    """The ``dot`` program is needed but not on PATH; ``dot_path`` is where the source went."""

    def __init__(self, what: str, dot_path: Path | None = None):
        self.dot_path = dot_path
        wrote = f"; wrote the DOT source to {dot_path} instead" if dot_path else ""
        super().__init__(
            Diagnostic(
                "error",
                f"cannot draw {what}: the Graphviz `dot` program is not installed "
                f"(not found on PATH){wrote}",
                hint=INSTALL_HINT,
            )
        )


def dot_program() -> str | None:
    """The path of ``dot`` (``$SPINDLE_DOT`` first, so tests can simulate its absence)."""
    override = os.environ.get("SPINDLE_DOT")
    if override is not None:
        return override if override and Path(override).is_file() else None
    return shutil.which("dot")


def dot_available() -> bool:
    return dot_program() is not None


def render_dot(graph: graphviz.Digraph | str, fmt: str, what: str = "the picture") -> bytes:
    """Run ``dot -T<fmt>`` on ``graph``; DotMissingError without ``dot``, SpindleError if dot
    itself fails (it prints why, e.g. a label it cannot lay out)."""
    if fmt not in DOT_FORMATS:
        raise SpindleError(f"dot cannot write '{fmt}' here (choose one of {DOT_FORMATS})")
    exe = dot_program()
    if exe is None:
        raise DotMissingError(what)
    source = graph if isinstance(graph, str) else graph.source
    try:
        done = subprocess.run(
            [exe, f"-T{fmt}"], input=source.encode(), capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SpindleError(f"running {exe} failed while drawing {what}: {exc}") from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()
        raise SpindleError(f"dot failed while drawing {what} (exit {done.returncode}): {err}")
    return done.stdout


def dot_fallback_path(path: Path) -> Path:
    """Where the DOT source goes when ``path`` (an .svg/.png/.pdf) cannot be drawn."""
    return path.with_suffix(".dot")


def write_dot_picture(graph: graphviz.Digraph, path: Path, fmt: str, what: str) -> Path:
    """Write ``graph`` to ``path`` as ``fmt`` ("dot" writes the source). Without ``dot``, write
    the source beside ``path`` and raise DotMissingError naming it. Returns what was written."""
    if fmt == "dot":
        write_atomic(path, graph.source)
        return path
    if not dot_available():
        fallback = dot_fallback_path(path)
        write_atomic(fallback, graph.source)
        raise DotMissingError(what, fallback)
    write_atomic(path, render_dot(graph, fmt, what))
    return path
