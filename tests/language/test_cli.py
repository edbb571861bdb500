"""``spindle check`` and ``spindle fmt`` end to end, in process."""

from __future__ import annotations

import io
import json
from pathlib import Path

from spindle_dsl.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MESSY = (
    "modality text{tokens=8 vocab=100}\n"
    "module lm:transformer(layers=1,hidden=8,heads=2,causal=true,vocab=100)\n"
    "task t{text->lm;batch=2}\n"
)


def test_check_prints_a_summary(capsys):
    assert main(["check", str(EXAMPLES / "tiny_mm.spindle")]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "tiny_mm.spindle: ok" in out
    assert "4 x cpu" in out and "6 MetaOps in 3 levels" in out
    row = next(line for line in out.splitlines() if line.startswith("caption/lm"))
    assert row.split()[:6] == ["caption/lm", "2", "6", "24", "28", "28"]


def test_check_json_has_the_same_figures(capsys):
    assert (
        main(["check", str(EXAMPLES / "qwen_val.spindle"), "--json", "--mix", "audio_heavy"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["mix"] == "audio_heavy"
    assert [t["batch"] for t in data["tasks"]] == [103, 614, 102, 205]
    op = next(o for o in data["metaops"] if o["id"] == "av_chat/llm")
    assert (op["layers"], op["tokens"], op["level"]) == (32, 1262, 2)
    assert op["train_gflop"] == 3 * op["fwd_gflop"]
    assert data["totals"]["params"] == sum(m["params"] for m in data["modules"])


def test_check_overrides_the_cluster(capsys):
    assert main(["check", str(EXAMPLES / "tiny_mm.spindle"), "--devices", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["cluster"]["devices"], data["cluster"]["devices_per_node"]) == (8, 8)


def test_check_reports_errors_on_stderr_and_exits_1(tmp_path, capsys):
    bad = tmp_path / "bad.spindle"
    bad.write_text(MESSY.replace("text->lm", "text->lmm"))
    assert main(["check", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{bad}:3:14: error: unknown module 'lmm' (did you mean 'lm'?)" in err
    assert "^^^" in err and "Traceback" not in err


def test_check_missing_and_undecodable_files(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope.spindle")]) == 1
    assert "cannot read" in capsys.readouterr().err
    binary = tmp_path / "bin.spindle"
    binary.write_bytes(b"task t {\n\xff\xfe }\n")
    assert main(["check", str(binary)]) == 1
    assert f"{binary}:2:1: error: the file is not UTF-8" in capsys.readouterr().err


def test_fmt_check_diff_and_rewrite(tmp_path, capsys):
    spec = tmp_path / "messy.spindle"
    spec.write_text(MESSY)
    spec.chmod(0o644)
    assert main(["fmt", "--check", str(spec)]) == 1
    assert "would reformat" in capsys.readouterr().err
    assert spec.read_text() == MESSY
    assert main(["fmt", "--diff", str(spec)]) == 0
    assert "+task t {" in capsys.readouterr().out
    assert main(["fmt", str(spec)]) == 0
    assert spec.read_text().startswith("modality text { tokens = 8; vocab = 100 }\n")
    assert spec.stat().st_mode & 0o777 == 0o644
    assert main(["fmt", "--check", str(spec), str(EXAMPLES / "tiny_mm.spindle")]) == 0


def test_fmt_leaves_a_file_with_syntax_errors_alone(tmp_path, capsys):
    spec = tmp_path / "broken.spindle"
    spec.write_text("task t { a -> }\n")
    assert main(["fmt", str(spec)]) == 1
    assert "module after '->'" in capsys.readouterr().err
    assert spec.read_text() == "task t { a -> }\n"


def test_fmt_stdin_to_stdout(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(MESSY))
    assert main(["fmt", "-"]) == 0
    assert capsys.readouterr().out.endswith("\ntask t { text -> lm; batch = 2 }\n")


def test_check_on_a_scheduled_spec_is_clean_and_lists_its_phases(spec_dir, capsys):
    spec = spec_dir / "next" / "tiny_schedule.spindle"
    assert main(["check", str(spec)]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # no warning: caption_only leaving transcribe out is the schedule's plan
    rows = [line.split() for line in out.splitlines() if line[:5].strip().isdigit()]
    assert rows == [
        ["1", "0-2", "warmup", "32", "24", "8"],
        ["2", "3-5", "caption_only", "32", "32", "0"],
        ["3", "6-", "balanced", "48", "24", "24"],
    ]
    assert main(["check", str(spec), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["mix"] for p in data["schedule"]] == ["warmup", "caption_only", "balanced"]
    assert main(["fmt", "--check", str(EXAMPLES / "tiny_schedule.spindle")]) == 0
