"""``spindle train``'s recipe flags end to end on tiny_mm: warmup then cosine decay, clipping,
the step log's fields, the same run on 2 and 4 processes, a resumed run, evaluation on
held-out data from ``spindle data synth``, TensorBoard scalars and ``spindle plot``."""

from __future__ import annotations

import json

import pytest

from spindle_dsl.cli import main

pytestmark = pytest.mark.slow

RECIPE = ["--steps", "6", "--warmup-steps", "3", "--lr-decay", "cosine", "--clip-grad", "0.5"]


def _log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


@pytest.fixture(scope="module")
def run_two(tmp_path_factory, spec_dir):
    """The 6-step run on 2 processes, evaluating held-out data every 2 steps, with its log
    and TensorBoard folder."""
    tmp = tmp_path_factory.mktemp("recipe")
    spec = str(spec_dir / "tiny_mm.spindle")
    held = tmp / "held"
    assert main(["data", "synth", spec, "--samples", "48", "--seed", "3", "--out", str(held)]) == 0
    log, board = tmp / "two.jsonl", tmp / "board"
    code = main(
        ["train", spec, "--nproc", "2", *RECIPE, "--log-json", str(log), "--no-progress",
         "--eval-data", str(held), "--eval-every", "2", "--tensorboard", str(board)]
    )  # fmt: skip
    assert code == 0
    return spec, tmp, _log(log), board, log


def test_lr_warms_up_then_decays_and_every_step_logs_its_figures(run_two):
    _, _, lines, _, _ = run_two
    lrs = [x["lr"] for x in lines]
    assert lrs[:3] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3])  # rising over 3 steps
    assert lrs[2] > lrs[3] > lrs[4] > lrs[5] == 0.0  # then falling to min_lr at the end
    for x in lines:
        assert x["grad_norm"] > 0 and x["tokens_per_s"] > 0 and x["samples_per_s"] > 0
        assert 0 < x["mfu"] < 1


def test_held_out_loss_is_logged_every_two_steps_for_every_task(run_two):
    _, _, lines, _, _ = run_two
    assert [x["step"] for x in lines if "eval_loss" in x] == [2, 4, 6]
    for x in lines:
        if "eval_loss" in x:
            assert set(x["eval_loss"]) == {"caption", "transcribe"}
            assert all(4 < v < 8 for v in x["eval_loss"].values())


def test_four_processes_give_the_same_losses_lrs_and_norms(run_two, tmp_path):
    spec, _, two, _, _ = run_two
    log = tmp_path / "four.jsonl"
    assert main(["train", spec, "--nproc", "4", *RECIPE, "--log-json", str(log),
                 "--no-progress"]) == 0  # fmt: skip
    four = _log(log)
    assert len(four) == len(two) == 6
    for a, b in zip(two, four, strict=True):
        assert _relative(a["lr"], b["lr"]) < 1e-12
        assert _relative(a["grad_norm"], b["grad_norm"]) < 1e-5
        assert all(_relative(a["loss"][t], b["loss"][t]) < 1e-5 for t in a["loss"])


def test_three_steps_then_a_resume_to_six_follow_the_uninterrupted_run(run_two, tmp_path):
    spec, _, whole, _, _ = run_two
    log, ckpt = tmp_path / "resumed.jsonl", tmp_path / "ckpt"
    common = [*RECIPE[2:], "--log-json", str(log), "--checkpoint-dir", str(ckpt), "--no-progress"]
    assert main(["train", spec, "--nproc", "2", "--steps", "3", *common]) == 0
    assert main(["train", spec, "--nproc", "2", "--steps", "6", "--checkpoint-every", "1",
                 "--keep-checkpoints", "2", *common]) == 0  # fmt: skip
    resumed = _log(log)
    assert [x["step"] for x in resumed] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(whole, resumed, strict=True):
        assert a["lr"] == b["lr"]
        assert all(_relative(a["loss"][t], b["loss"][t]) < 1e-6 for t in a["loss"])
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step-000005", "step-000006"]


def test_tensorboard_holds_the_logged_scalars(run_two):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, _, lines, board, _ = run_two
    events = EventAccumulator(str(board))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss/caption", "eval_loss/transcribe", "lr", "grad_norm", "mfu"} <= tags
    lrs = [(e.step, e.value) for e in events.Scalars("lr")]
    assert lrs == [(x["step"], pytest.approx(x["lr"], rel=1e-6)) for x in lines]
    assert [e.step for e in events.Scalars("eval_loss/caption")] == [2, 4, 6]


def test_plot_draws_the_log(run_two, tmp_path, capsys):
    _, _, _, _, log = run_two
    out = tmp_path / "loss.png"
    assert main(["plot", str(log), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "6 steps, 2 task(s), 6 held-out point(s)" in capsys.readouterr().out


def test_held_out_data_for_a_task_that_does_not_exist_is_an_error(run_two, capfd):
    spec, tmp, *_ = run_two
    code = main(["train", spec, "--nproc", "2", "--steps", "1", "--no-progress",
                 "--eval-data", f"chat={tmp / 'held' / 'caption'}"])  # fmt: skip
    assert code == 1
    assert "--eval-data chat=" in capfd.readouterr().err
