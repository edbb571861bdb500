"""A run through a schedule of mixes, switching plans in place, against the one-process oracle.

Float64 at 1e-9, as the other runtime tests. The schedule here is tiny_schedule's with its
phases moved earlier (0: warmup, 2: caption_only, 3: balanced), so four steps visit every
phase. The phases run different schedulers (paper, sequential, paper), so the switches really
move weights between ranks, park transcribe's parts when caption_only leaves it out and bring
them back for balanced; a resume from the checkpoint at the first boundary, on another number
of processes, parks them from the checkpoint instead. Both runs follow a warmup and cosine
decay with clipping, which the switches and the resume must carry on as one process would.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from runtime_helpers import checkpoint_state, loss_errors, worst_relative

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import TorchBackend
from spindle_dsl.backends.torch.reference import ScheduleReference
from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_text
from spindle_dsl.plan.bundle import BundlePhase, PlanBundle
from spindle_dsl.plan.model import SpecRef
from spindle_dsl.planner import make_plan

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 4
RECIPE = dict(warmup_steps=1, lr_decay="cosine", min_lr=1e-4, clip_grad=0.5)


def compiled(devices: int):
    text = (EXAMPLES / "tiny_schedule.spindle").read_text()
    text = text.replace("  3: caption_only\n  6: balanced", "  2: caption_only\n  3: balanced")
    return compile_text(text, "tiny_schedule.spindle", cluster_overrides={"devices": devices})


def bundle(schedule, schedulers: tuple[str, ...]) -> PlanBundle:
    phases = tuple(
        BundlePhase(p.first_step, p.mix, make_plan(p.graph, make_cost_model(p.graph.cluster),
                                                   scheduler=s))
        for p, s in zip(schedule.phases, schedulers, strict=True)
    )  # fmt: skip
    g = schedule.phases[0].graph
    return PlanBundle(SpecRef(g.spec_path, g.spec_sha256, None), phases)


@pytest.fixture(scope="module")
def oracle():
    ref = ScheduleReference(compiled(4).schedule, dtype="float64")
    history = ref.train(STEPS, **RECIPE)
    assert sum(o.grad_norm > RECIPE["clip_grad"] for o in ref.trained) >= 2  # it clips
    return history, ref.state(), ref.trained


def test_switching_plans_in_a_run_matches_plain_pytorch(tmp_path, oracle):
    c = compiled(4)
    assert [(p.first_step, p.mix) for p in c.schedule.phases] == [
        (0, "warmup"),
        (2, "caption_only"),
        (3, "balanced"),
    ]
    plans = bundle(c.schedule, ("paper", "sequential", "paper"))
    full = tmp_path / "full"
    config = RunConfig(
        steps=STEPS, dtype="float64", checkpoint_dir=str(full), checkpoint_every=1,
        progress=False, **RECIPE,
    )  # fmt: skip
    result = TorchBackend().train(c.graph, plans, config, nproc=4, schedule=c.schedule)
    history, state, trained = oracle
    assert [r.mix for r in result.steps] == ["warmup", "warmup", "caption_only", "balanced"]
    assert [r.lr for r in result.steps] == [o.lr for o in trained]
    assert [r.grad_norm for r in result.steps] == pytest.approx([o.grad_norm for o in trained])
    assert [t for t, _ in result.steps[2].losses] == ["caption"]
    assert loss_errors(history, result.steps) < 1e-9
    worst, where = worst_relative(state, checkpoint_state(full))
    assert worst < 1e-9, f"{where}: {worst}"
    # the switches moved weights to ranks that lacked them, parked transcribe and brought it back
    first, second = result.extra["switches"]
    assert (first["step"], first["mix"], second["step"], second["mix"]) == (
        2, "caption_only", 3, "balanced"
    )  # fmt: skip
    assert (first["parked"], second["unparked"]) == (4, 4)  # hearing x2, its input, audio_proj
    assert sum(r["received_parts"] for r in first["per_rank"]) > 0
    assert first["kept_parts"] > 0  # the language model keeps its ranks: nothing of it moved
    assert result.steps[2].switch_s == first["seconds"] > 0
    assert result.steps[1].switch_s is None

    # the checkpoint of the first boundary (written by warmup's plan) resumes in caption_only
    # on two processes: transcribe's parts are parked from the checkpoint, then come back;
    # this run keeps AdamW state whole on every holder (no sharding)
    c2 = compiled(2)
    moved = tmp_path / "moved"
    shutil.copytree(full / "step-000002", moved / "step-000002")
    (moved / "latest").write_text("step-000002\n")
    again = TorchBackend().train(
        c2.graph,
        bundle(c2.schedule, ("paper", "paper", "sequential")),
        RunConfig(
            steps=STEPS,
            dtype="float64",
            checkpoint_dir=str(moved),
            progress=False,
            optimizer_sharding=False,
            **RECIPE,
        ),
        nproc=2,
        schedule=c2.schedule,
    )
    assert again.resumed_from == 2 and [r.step for r in again.steps] == [3, 4]
    assert [r.mix for r in again.steps] == ["caption_only", "balanced"]
    assert loss_errors(history[2:], again.steps) < 1e-9
    assert [r.lr for r in again.steps] == [o.lr for o in trained[2:]]
    assert worst_relative(state, checkpoint_state(moved))[0] < 1e-9
