"""Spreading the loss phase by relabeling devices over a prefix or suffix of the waves
(``planner.evaluate.relabel``): the relabeling keeps every wave valid, the greedy pairing lowers
the loss phase, and a plan whose LM sinks end on the same devices gets quicker and still
fits and validates, while a plan with nothing to gain is returned as it is."""

from __future__ import annotations

import numpy as np
import pytest

from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_text
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner.evaluate.build import Evaluated, context, time_of, to_plan
from spindle_dsl.planner.evaluate.placement import PlacedPiece
from spindle_dsl.planner.evaluate.relabel import (
    RENAME_NOTE,
    best_peak,
    candidates,
    loss_loads,
    placed,
    relabeled,
    rename_devices,
    spread,
    spread_round,
)
from spindle_dsl.planner.model.problem import Piece, Schedule

# tiny_mm's shape on GPUs of their own (no CPU cores shared between devices, which would
# hide the balance), with a vocabulary large enough for the LM losses to matter
SPEC = """
cluster { devices = 4  device = "A800-80GB"  devices_per_node = 4 }
modality image { tokens = 16 }
modality audio { tokens = 24  features = 20 }
modality text  { tokens = 64  vocab = 128000 }
encoder vision  : vit(layers = 4, hidden = 256, heads = 4, patch = 4) <- image
encoder hearing : transformer(layers = 2, hidden = 256, heads = 4) <- audio
module  vision_proj : mlp(in = 256, out = 512)
module  audio_proj  : mlp(in = 256, out = 512)
shared  lm : transformer(layers = 6, hidden = 512, heads = 8, causal = true, vocab = 128000)
task caption    { image -> vision -> vision_proj -> lm   text -> lm   loss = lm }
task transcribe { audio -> hearing -> audio_proj -> lm   text -> lm   loss = lm }
mix default { global_batch = 256  caption = 1  transcribe = 1 }
"""


def _pp(op: str, first: int, end: int, devices: tuple[int, ...]) -> PlacedPiece:
    return PlacedPiece(op, first, end, devices)


# both LM sinks end on devices 0-1 while devices 2-3 ran only the encoders
PILED = (
    (_pp("caption/vision", 0, 4, (0, 1)), _pp("transcribe/hearing", 0, 2, (2, 3))),
    (_pp("caption/vision_proj", 0, 1, (0, 1)), _pp("transcribe/audio_proj", 0, 1, (2, 3))),
    (_pp("caption/lm", 0, 6, (0, 1)),),
    (_pp("transcribe/lm", 0, 6, (0, 1)),),
)


# both LM sinks end on every device: the loss phase is even already
EVERYWHERE = (
    (_pp("caption/vision", 0, 4, (0, 1, 2, 3)),),
    (_pp("transcribe/hearing", 0, 2, (0, 1, 2, 3)),),
    (_pp("caption/vision_proj", 0, 1, (0, 1)), _pp("transcribe/audio_proj", 0, 1, (2, 3))),
    (_pp("caption/lm", 0, 6, (0, 1, 2, 3)),),
    (_pp("transcribe/lm", 0, 6, (0, 1, 2, 3)),),
)


@pytest.fixture(scope="module")
def ctx():
    graph = compile_text(SPEC, path="<lossbalance>").graph
    return context(graph, make_cost_model(graph.cluster))


def _evaluated(ctx, waves) -> Evaluated:
    sched = Schedule("x", tuple(tuple(Piece(p.op, p.first, p.end, p.n) for p in w) for w in waves))
    pl = placed(ctx, waves)
    return Evaluated(sched, pl, time_of(ctx, pl))


def test_relabeling_keeps_every_wave_a_wave_and_touches_only_its_side_of_the_cut():
    label = [2, 3, 0, 1]
    pre = relabeled(PILED, label, 2, prefix=True)
    post = relabeled(PILED, label, 2, prefix=False)
    assert pre[2:] == PILED[2:] and post[:2] == PILED[:2]
    assert pre[0][0].devices == (2, 3) and pre[0][1].devices == (0, 1)
    assert post[3][0].devices == (2, 3)
    for waves in (pre, post):
        for w, old in zip(waves, PILED, strict=True):
            assert [p.n for p in w] == [p.n for p in old]
            ids = [d for p in w for d in p.devices]
            assert len(ids) == len(set(ids))  # still disjoint


def test_loss_loads_put_each_sinks_loss_on_its_last_pieces_devices(ctx):
    load = loss_loads(ctx.step, PILED, 1)
    assert set(load) == {0, 1} and load[0] > 0
    split = relabeled(PILED, [2, 3, 0, 1], 3, prefix=True)  # caption/lm moves to 2-3
    moved = loss_loads(ctx.step, split, 1)
    assert set(moved) == {0, 1, 2, 3}
    assert moved[0] + moved[2] == pytest.approx(load[0])


def test_the_greedy_pairing_evens_the_sums_moving_few_devices():
    a = np.array([3.0, 3.0, 0.0, 0.0, 0.0, 0.0])  # losses that move with the relabeling
    b = np.array([2.0, 2.0, 1.0, 1.0, 0.0, 0.0])  # losses that stay
    label = spread(a, b)
    assert label is not None and sorted(label) == list(range(6))
    after = np.zeros(6)
    after[label] = a
    assert (after + b).max() == best_peak(a, b) == 3.0
    assert sum(x != y for x, y in enumerate(label)) == 4  # two exchanges, nothing else
    assert spread(np.array([1.0, 0.0]), np.array([0.0, 1.0])) is None  # already even


def test_candidates_split_the_sinks_at_their_last_waves(ctx):
    cands = candidates(ctx.step, PILED, 1, 4)
    # caption/lm ends in wave 2, transcribe/lm in wave 3: one split, relabeled either side
    assert {(cut, prefix) for _, cut, prefix, _, _ in cands} == {(3, True), (3, False)}
    peak, cut, prefix, a, b = cands[0]
    waves = relabeled(PILED, spread(a, b), cut, prefix)
    assert max(loss_loads(ctx.step, waves, 1).values()) == pytest.approx(peak)
    assert peak < max(loss_loads(ctx.step, PILED, 1).values()) * 0.9
    moved = {p.op: p.devices for w in waves for p in w}
    assert set(moved["caption/lm"]).isdisjoint(moved["transcribe/lm"])


def test_a_piled_plan_gets_a_quicker_loss_phase_and_still_fits_and_validates(ctx):
    before = _evaluated(ctx, PILED)
    after = rename_devices(ctx, before, inputs=False)
    assert after.timing.loss_s < before.timing.loss_s * 0.9
    assert after.iteration_s < before.iteration_s
    assert after.fits
    assert any(n.startswith(RENAME_NOTE) and "losses" in n for n in after.schedule.notes)
    assert [[p.n for p in w] for w in after.placement.waves] == [[p.n for p in w] for w in PILED]
    others = dict.fromkeys(("sequential", "distmm", "optimus"), before.iteration_s)
    plan = to_plan(ctx, after, lower_bound_s=0.0, baselines=others, wall_s=0.0, notes=(), extra={})
    assert validate_plan(plan) == []
    assert plan.iteration_s == pytest.approx(after.iteration_s)


def test_a_plan_whose_sinks_end_on_every_device_is_returned_as_it_is(ctx):
    ev = _evaluated(ctx, EVERYWHERE)
    assert rename_devices(ctx, ev) is ev


def test_a_round_skips_what_cannot_win_but_always_spreads_the_named(ctx):
    piled = _evaluated(ctx, PILED)
    out = spread_round(ctx, {"slow": piled}, always=())
    assert out["slow"].iteration_s < piled.iteration_s  # nothing quicker: it is spread
    quick = rename_devices(ctx, piled, inputs=False)
    out = spread_round(ctx, {"a": quick, "b": piled}, always=())
    assert out["b"] is piled  # even spread evenly it could not beat "a"
    out = spread_round(ctx, {"a": quick, "b": piled}, always=("b",))
    assert out["b"].iteration_s < piled.iteration_s


def test_a_renaming_keeps_each_piece_s_device_order() -> None:
    """The k-th device of a piece takes the k-th rows (the shard order placement chose): a
    renaming renames each device in its place and never sorts them."""
    waves = ((PlacedPiece("a", 0, 2, (3, 0, 2)),), (PlacedPiece("b", 0, 1, (1, 2)),))
    label = [1, 0, 3, 2]  # 0 <-> 1, 2 <-> 3
    assert relabeled(waves, label, 1) == (
        (PlacedPiece("a", 0, 2, (2, 1, 3)),),
        (PlacedPiece("b", 0, 1, (1, 2)),),  # from the cut on, unchanged
    )
    assert relabeled(waves, label, 1, prefix=False)[1] == (PlacedPiece("b", 0, 1, (0, 3)),)
