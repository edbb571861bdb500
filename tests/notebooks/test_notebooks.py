"""The notebooks are stored clean and run top to bottom on CPU, as a reader would run them.

Each notebook asserts its own results in its cells (a plan that validates, a loss that was
logged, a sweep in which every setting plans), so executing it without an error is a real
check, not only a smoke test; the test reads some executed outputs back as well.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
NAMES = (
    "quickstart.ipynb",
    "interactive_planning.ipynb",
    "train_tiny_mm.ipynb",
    "digits.ipynb",
    "hf_vlm.ipynb",
)
SWEEP = (8, 16, 24, 32, 48, 64)  # interactive_planning's device counts


def stdout_of(nb, marker: str) -> str:
    """The printed output of the one code cell whose source contains ``marker``."""
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def check_sweep(nb) -> None:
    """interactive_planning's table: a row per device count, each plan faster than running the
    tasks one after another and the iteration falling as devices are added."""
    rows = [line.split() for line in stdout_of(nb, "session.update(devices=n)").splitlines()]
    assert rows[0][:2] == ["devices", "iteration"], rows
    assert [int(r[0]) for r in rows[1:]] == list(SWEEP), rows
    iterations = [float(r[1].rstrip("s")) for r in rows[1:]]
    speedups = [float(r[2].rstrip("x")) for r in rows[1:]]
    assert all(s >= 1.0 for s in speedups), speedups
    assert iterations[-1] < iterations[0], iterations


OUTPUT_CHECKS = {"interactive_planning.ipynb": check_sweep}


@pytest.mark.parametrize("name", NAMES)
def test_stored_without_outputs(name):
    nb = json.loads((NOTEBOOKS / name).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, cell["source"]


def test_stored_notebooks_match_their_generator():
    done = subprocess.run(
        [sys.executable, str(NOTEBOOKS / "build_notebooks.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("ipykernel")
    for var, sub in (("JUPYTER_RUNTIME_DIR", "rt"), ("MPLCONFIGDIR", "mpl"), ("IPYTHONDIR", "ip")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=240,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},  # outputs the notebook writes go here
    )
    start = time.perf_counter()
    client.execute()
    print(f"{name}: executed in {time.perf_counter() - start:.1f} s")
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code")
    OUTPUT_CHECKS.get(name, lambda _nb: None)(nb)
