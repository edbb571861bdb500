"""The README's user-kind example runs: register, compile, plan and train with a new kind."""

import runpy
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_kind.py"


def test_custom_kind_example_compiles_plans_and_trains(capsys):
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    # 3 matmuls of 32 x 64: the kind's own parameter count reached the MetaGraph.
    assert "caption/adapter: 2 layers, 6144 params per layer" in out
    assert "plan:" in out
    assert out.count("step ") == 3
