"""`pip install .` (not only editable) ships the grammar and the backends inside the package."""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built by this environment's pip without build isolation (no
    download: the build backend, setuptools, is this environment's). Any failure fails the
    tests, a missing module included: a wheel that cannot be built is a packaging bug, or an
    environment without the backend that ``pyproject.toml``'s ``[build-system]`` names."""
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run([*pip, "-w", str(out), str(REPO)], capture_output=True, text=True)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}{done.stderr}"
    (found,) = out.glob("spindle_dsl-*.whl")
    return found


def test_wheel_holds_grammar_and_backends_under_the_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "spindle_dsl/grammar/spindle.lark" in names
    assert "spindle_dsl/backends/torch/executor.py" in names
    tops = {n.split("/")[0] for n in names if not n.startswith("spindle_dsl-")}
    assert tops == {"spindle_dsl"}, f"the wheel claims other top-level names: {tops}"


def test_installed_wheel_parses_a_spec_outside_the_repository(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import spindle_dsl, spindle_dsl.backends.torch;"
        "from spindle_dsl.language import compile_text;"
        "assert spindle_dsl.__file__.startswith(sys.argv[1]), spindle_dsl.__file__;"
        "g = compile_text('modality t { tokens = 4  vocab = 9 }\\n"
        "shared m : transformer(layers = 1, hidden = 8, heads = 2, causal = true, vocab = 9)\\n"
        "task a { batch = 2; t -> m }\\n').graph;"
        "print(g.metaops[0].id)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(target)], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "a/m"


@pytest.mark.slow
def test_a_plain_install_trains_from_the_repository_root(wheel, tmp_path):
    """After a plain (not editable) install, ``spindle train --nproc 2`` run from the
    checkout's root trains: workers started with ``python -m`` would put the root first on
    sys.path, where the source ``spindle_dsl/`` (without the backends) would shadow the
    installed package.

    A fresh venv gets the wheel (installed before anything else is visible to it, so pip
    touches nothing outside it) and then, for torch and the other dependencies, a .pth line
    naming this environment's site-packages: no download, torch not reinstalled."""
    # nothing of the caller's path either: a PYTHONPATH naming a checkout with an egg-info
    # would make pip take the package as installed and skip the wheel
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    done = subprocess.run(
        [*install, "--no-deps", "--no-index", str(wheel)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "deps-from-the-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run(
        [str(python), "-c", "import spindle_dsl, torch; print(spindle_dsl.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(site), where  # installed, its dependencies found
    done = subprocess.run(
        [str(venv / "bin" / "spindle"), "train", "examples/tiny_mm.spindle", "--nproc", "2",
         "--steps", "2", "--no-progress"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "final loss (step 2)" in done.stdout
    # `python -m spindle_dsl` from the root (how torchrun starts it) imports the checkout's
    # source folder, which finds grammar/ and backends/ beside it
    done = subprocess.run(
        [str(python), "-c", "import runpy, sys; sys.argv[1:] = ['check', sys.argv[1]]; "
         "import spindle_dsl.backends.torch, spindle_dsl; print(spindle_dsl.__file__); "
         "runpy.run_module('spindle_dsl', run_name='__main__')", "examples/tiny_mm.spindle"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(str(REPO / "spindle_dsl"))
    assert "examples/tiny_mm.spindle: ok" in done.stdout
