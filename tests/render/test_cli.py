"""`spindle render`, `spindle report` and the plan picture options, run in-process."""

from __future__ import annotations

import argparse
import json

import pytest

from spindle_dsl.cli import main
from spindle_dsl.cli.cmd_render import add_plan_outputs, write_plan_outputs
from spindle_dsl.render.trace import check_trace


@pytest.fixture
def plan_file(plan, tmp_path):
    path = tmp_path / "plan.json"
    plan.write(path)
    return path


@pytest.mark.parametrize(
    ("what", "expect"),
    [("metagraph", "task caption"), ("waves", "wave 3"), ("timeline", "A caption/vision")],
)
def test_render_prints_text_without_output(plan_file, capsys, what, expect):
    assert main(["render", str(plan_file), "--what", what]) == 0
    assert expect in capsys.readouterr().out


def test_render_dot_source_and_trace(plan_file, tmp_path, capsys):
    out = tmp_path / "w.dot"
    assert main(["render", str(plan_file), "-o", str(out)]) == 0
    assert out.read_text().startswith("digraph waves")
    trace = tmp_path / "t.json"
    assert main(["render", str(plan_file), "--what", "trace", "-o", str(trace)]) == 0
    assert check_trace(json.loads(trace.read_text())) == []


def test_render_timeline_needs_no_dot(plan_file, tmp_path, no_dot):
    out = tmp_path / "t.png"
    assert main(["render", str(plan_file), "--what", "timeline", "-o", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


@pytest.mark.needs_dot
def test_render_svg_with_dot(plan_file, tmp_path):
    out = tmp_path / "m.svg"
    assert main(["render", str(plan_file), "--what", "metagraph", "-o", str(out)]) == 0
    assert "<svg" in out.read_text()


def test_render_without_dot_writes_source_and_says_how_to_install(
    plan_file, tmp_path, capsys, no_dot
):
    out = tmp_path / "w.svg"
    assert main(["render", str(plan_file), "--what", "waves", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Graphviz `dot` program is not installed" in err and "apt-get install graphviz" in err
    assert not out.exists()
    assert (tmp_path / "w.dot").read_text().startswith("digraph waves")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--what", "timeline", "--format", "dot"], "not 'dot'"),
        (["--what", "trace", "--format", "svg"], "json"),
        (["-o", "x.bmp"], "cannot tell the format"),
        (["--format", "png"], "give -o FILE"),
    ],
)
def test_render_usage_errors_are_clear(plan_file, capsys, argv, message):
    assert main(["render", str(plan_file), *argv]) == 1
    assert message in capsys.readouterr().err


def test_render_bad_plan_files(tmp_path, capsys):
    assert main(["render", str(tmp_path / "missing.json")]) == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "spindle-plan", "version": 1}')
    assert main(["render", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "cannot read plan" in err and "malformed plan" in err and "Traceback" not in err


def test_report_from_a_plan_file(plan_file, tmp_path, capsys, no_dot):
    out = tmp_path / "r.html"
    assert main(["report", str(plan_file), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "wrote" in captured.out and "warning: MetaGraph" in captured.err
    assert "<h2>Waves</h2>" in out.read_text()


def test_plan_outputs(plan, tmp_path, capsys, no_dot):
    parser = argparse.ArgumentParser()
    add_plan_outputs(parser)
    args = parser.parse_args(
        ["--svg", str(tmp_path / "p.svg"), "--trace", str(tmp_path / "t.json")]
    )
    assert write_plan_outputs(args, plan) == 1  # no dot: the DOT source instead, and a reason
    assert (tmp_path / "p.dot").exists() and (tmp_path / "t.json").exists()
    assert "not installed" in capsys.readouterr().err
    assert write_plan_outputs(parser.parse_args([]), plan) == 0
