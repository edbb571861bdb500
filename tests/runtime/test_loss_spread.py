"""lm losses spread over other devices than their sink's last entry (``Plan.loss_devices``).

The spread sink's head inputs are re-split position by position over its loss devices, which
score them and send the gradients back: the run must still train the model the
single-process oracle trains, exactly (float64), with one micro-batch and with two (each
pass's rows offset in the batch), with groups larger than the sink's last entry, one of them
cutting rows in the middle.
"""

from __future__ import annotations

import dataclasses
import json

import handgraph as h
import pytest
from runtime_helpers import checkpoint_state, loss_errors, worst_relative

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import ReferenceModel, TorchBackend
from spindle_dsl.backends.torch.parts import Part
from spindle_dsl.backends.torch.schedule import LM_LOSS_FLOW, build_schedule
from spindle_dsl.errors import ExecutionError

# TINY_WAVES end caption/lm on (1, 3) and transcribe/lm on (0, 2); transcribe's 8 rows of 11
# positions split over 3 devices as 30, 30 and 28 positions: rows cut in the middle
SPREAD = (("caption/lm", (2, 0, 3)), ("transcribe/lm", (1, 3, 0)))


def _spread_plan(graph, micro_batches: int = 1, spread=SPREAD):
    plan = h.make_plan(graph, h.TINY_WAVES)
    return dataclasses.replace(plan, loss_devices=spread, micro_batches=micro_batches)


def test_schedule_moves_the_head_inputs_and_holds_the_head_on_the_loss_devices():
    graph = h.tiny_mm(4)
    schedule = build_schedule(graph, _spread_plan(graph), 4)
    flows = {f.key: f for f in schedule.flows_into(schedule.n_waves)}
    caption = flows[f"{LM_LOSS_FLOW}caption/lm"]
    assert (caption.src, caption.dst) == ((1, 3), (2, 0, 3))
    # the positions the head reads: text tokens - 1, at the lm's width
    assert caption.tail == (96,) and caption.backward and caption.src_unit == 11
    assert schedule.holder_map[Part("lm", "head")] == (0, 1, 2, 3)
    assert set(schedule.loss_group("caption")) == {0, 2, 3}


def test_a_plan_spreading_what_is_not_an_lm_sink_is_refused():
    graph = h.tiny_mm(4)
    bad = _spread_plan(graph, spread=(("caption/vision", (0, 1)), ("transcribe/lm", (7,))))
    with pytest.raises(ExecutionError) as err:
        build_schedule(graph, bad, 4)
    assert "caption/vision, which is not a sink of an lm task" in str(err.value)
    assert "loss_devices of transcribe/lm names devices [7]" in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_spread_losses_train_the_oracle_model(micro_batches, tmp_path):
    graph = h.tiny_mm(4)
    plan = _spread_plan(graph, micro_batches)
    steps = 3
    trace = tmp_path / "trace.json"
    config = RunConfig(
        steps=steps,
        dtype="float64",
        checkpoint_dir=str(tmp_path),
        progress=False,
        trace=str(trace),
    )
    result = TorchBackend().train(graph, plan, config, nproc=4)
    # the rows were scored where the plan says: each rank of a loss group, every pass
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    for sink, group in SPREAD:
        scored = [e["tid"] for e in events if e.get("name") == f"score {sink}"]
        assert sorted(scored) == sorted(group * steps * micro_batches), sink
    ref = ReferenceModel(graph, dtype="float64")
    history = ref.train(steps)
    assert loss_errors(history, result.steps) < 1e-12
    worst, where = worst_relative(ref.state(), checkpoint_state(tmp_path))
    assert worst < 1e-9, where
    fresh = ReferenceModel(graph, dtype="float64").state()
    assert worst_relative(fresh, checkpoint_state(tmp_path))[0] > 1e-4
