"""`pip install .` (not only editable) ships the grammar and the backends inside the package."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run([*pip, "-w", str(out), str(REPO)], capture_output=True, text=True)
    if done.returncode != 0 and "No module named" in done.stderr:
        pytest.skip(f"cannot build a wheel here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
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
