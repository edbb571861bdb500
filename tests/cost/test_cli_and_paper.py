"""The curves/profile commands end to end on the reference specs, and the analytic model's
plausibility at paper scale."""

from __future__ import annotations

import json

import pytest

from spindle_dsl.cli import main
from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.analytic import backward_multiplier


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_curves_table_and_json(spec_dir, capsys) -> None:
    spec = str(spec_dir / "tiny_mm.spindle")
    code, out, _ = run_cli(capsys, "curves", spec)
    assert code == 0
    assert "caption/lm" in out and "T(4)" in out and "speedup" in out
    code, out, _ = run_cli(capsys, "curves", spec, "--json", "--devices", "3")
    assert code == 0
    doc = json.loads(out)
    assert doc["source"] == "analytic" and doc["cluster"]["devices"] == 3
    fields = {
        "id", "task", "module", "kind", "layers", "batch", "tokens", "deps",
        "forward_flops_per_layer", "param_bytes_per_layer", "seconds_per_layer",
    }  # fmt: skip
    for record in doc["metaops"]:
        assert set(record) == fields
        assert list(record["seconds_per_layer"]) == ["1", "2", "3"]
    code, _, err = run_cli(capsys, "curves", spec, "--n", "0,9")
    assert code == 1 and "--n" in err
    # on 1,000 devices 999 is not an allocation a curve lists: a dash, and why
    code, out, _ = run_cli(capsys, "curves", spec, "--devices", "1000", "--n", "3,999,1000")
    assert code == 0 and "T(999)" in out and "-: not an allocation the planner lists" in out


def test_profile_then_use_it_everywhere(spec_dir, tmp_path, capsys) -> None:
    spec = str(spec_dir / "tiny_mm.spindle")
    out_file = tmp_path / "profile.json"
    code, out, err = run_cli(capsys, "profile", spec, "--out", str(out_file), "--points", "2")
    assert code == 0, err
    assert "wrote" in out and "[1/" in err  # progress went to stderr
    code, out, _ = run_cli(capsys, "curves", spec, "--json", "--profile", str(out_file))
    assert code == 0 and json.loads(out)["source"] == str(out_file)
    code, out, _ = run_cli(capsys, "check", spec, "--profile", str(out_file))
    assert code == 0 and "T(1)/layer" in out and "speedup" in out
    # A profile of another spec lacks these MetaOps: a clear error, not a traceback.
    other = str(spec_dir / "multitask_clip.spindle")
    code, _, err = run_cli(capsys, "curves", other, "--profile", str(out_file))
    assert code == 1 and "no measurement for" in err and "spindle profile" in err


def test_check_json_has_curve_fields(spec_dir, capsys) -> None:
    code, out, _ = run_cli(capsys, "check", str(spec_dir / "tiny_mm.spindle"), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["curves"] == {"source": "analytic", "devices": 4}
    for row in data["metaops"]:
        assert row["speedup"] == pytest.approx(row["t1_s"] / row["tN_s"])


@pytest.mark.parametrize("name", ["multitask_clip", "qwen_val"])
def test_paper_workloads_are_physically_plausible(spec_dir, name) -> None:
    from spindle_dsl.language import compile_file

    sequential = {}
    for devices in (8, 64):
        graph = compile_file(
            spec_dir / f"{name}.spindle", cluster_overrides={"devices": devices}
        ).graph
        curves = make_cost_model(graph.cluster).curves(graph)
        peak = graph.cluster.device.peak_flops
        total = 0.0
        for op in graph.metaops:
            work = backward_multiplier(op) * op.forward_flops_per_layer
            for n, t in curves[op.id].items():
                assert t >= work / (n * peak), (op.id, n)
            total += op.layers * curves[op.id].at(devices)
        sequential[devices] = total
    # 8x the devices: faster, but not more than 8x faster.
    assert 1.0 < sequential[8] / sequential[64] <= 8.0
