"""Renaming devices at wave boundaries so that pieces run where their inputs are
(``planner.evaluate.relabel``), in the one search over renamings that weighs them against the loss
phase's (``planner.evaluate.relabel``): the renaming is a permutation that lands each piece after
the cut on its source's devices, a plan whose projections were placed across the towers' devices
gets fewer moves and a quicker step and still fits and validates, a plan with nothing to gain
is returned as it is, and the search over both kinds ends quicker than the loss pairings
alone, which move pieces off their inputs."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from synth import count_calls

from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_text
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner.evaluate import relabel
from spindle_dsl.planner.evaluate.build import context, to_plan
from spindle_dsl.planner.evaluate.ledger import PartLedger
from spindle_dsl.planner.evaluate.placement import Topology, place
from spindle_dsl.planner.evaluate.relabel import (
    RENAME_NOTE,
    matching_label,
    relabeled,
    rename_devices,
)
from spindle_dsl.planner.starts.crosslevel import cpa_schedule

from .synth import random_problem
from .test_lossbalance import _evaluated, _pp
from .test_placement_equivalence import _slices

# two nodes of two GPUs, so that a move between the towers' devices crosses the network
SPEC = """
cluster { devices = 4  device = "A800-80GB"  devices_per_node = 2 }
modality image { tokens = 256 }
modality audio { tokens = 256  features = 80 }
modality text  { tokens = 64  vocab = 32000 }
encoder vision  : vit(layers = 4, hidden = 1024, heads = 8, patch = 4) <- image
encoder hearing : transformer(layers = 4, hidden = 1024, heads = 8) <- audio
module  vision_proj : mlp(in = 1024, out = 1024)
module  audio_proj  : mlp(in = 1024, out = 1024)
shared  lm : transformer(layers = 4, hidden = 1024, heads = 8, causal = true, vocab = 32000)
task caption    { image -> vision -> vision_proj -> lm   text -> lm   loss = lm }
task transcribe { audio -> hearing -> audio_proj -> lm   text -> lm   loss = lm }
mix default { global_batch = 256  caption = 1  transcribe = 1 }
"""


def _waves(vision_proj: tuple[int, ...], audio_proj: tuple[int, ...]):
    return (
        (_pp("caption/vision", 0, 4, (0, 1)), _pp("transcribe/hearing", 0, 4, (2, 3))),
        (
            _pp("caption/vision_proj", 0, 1, vision_proj),
            _pp("transcribe/audio_proj", 0, 1, audio_proj),
        ),
        (_pp("caption/lm", 0, 4, (0, 1, 2, 3)),),
        (_pp("transcribe/lm", 0, 4, (0, 1, 2, 3)),),
    )


# each projection placed on the other tower's node: both read their rows across the network
CROSSED = _waves((2, 3), (0, 1))
# each projection where its tower ran
MATCHED = _waves((0, 1), (2, 3))


@pytest.fixture(scope="module")
def ctx():
    graph = compile_text(SPEC, path="<cutmatch>").graph
    return context(graph, make_cost_model(graph.cluster))


def test_the_label_puts_each_piece_after_the_cut_on_its_sources_devices(ctx):
    after = matching_label(ctx, CROSSED, 1, prefix=False)
    assert after == [2, 3, 0, 1]
    renamed_after = relabeled(CROSSED, after, 1, prefix=False)
    assert renamed_after[:2] == MATCHED[:2]
    # the LM's pieces keep their shard order, each device renamed in its place
    assert [p.devices for w in renamed_after[2:] for p in w] == [(2, 3, 0, 1)] * 2
    before = matching_label(ctx, CROSSED, 1, prefix=True)  # the towers renamed instead
    renamed = relabeled(CROSSED, before, 1, prefix=True)
    assert {p.op: p.devices for p in renamed[0]} == {
        "caption/vision": (2, 3),
        "transcribe/hearing": (0, 1),
    }
    assert matching_label(ctx, MATCHED, 1, prefix=False) is None  # nothing to rename


def test_a_crossed_plan_moves_less_gets_quicker_and_still_fits_and_validates(ctx):
    before = _evaluated(ctx, CROSSED)
    after = rename_devices(ctx, before, losses=False)
    assert after.timing.wave_transfer[1] == pytest.approx(0.0, abs=1e-12)
    assert before.timing.wave_transfer[1] > 0
    assert after.timing.transfer_s < before.timing.transfer_s
    assert after.iteration_s < before.iteration_s
    assert after.fits
    assert any(n.startswith(RENAME_NOTE) and "transfers" in n for n in after.schedule.notes)
    sizes = [[p.n for p in w] for w in CROSSED]
    assert [[p.n for p in w] for w in after.placement.waves] == sizes
    others = dict.fromkeys(("sequential", "distmm", "optimus"), before.iteration_s)
    plan = to_plan(ctx, after, lower_bound_s=0.0, baselines=others, wall_s=0.0, notes=(), extra={})
    assert validate_plan(plan) == []
    assert plan.iteration_s == pytest.approx(after.iteration_s)


def test_a_matched_plan_is_returned_as_it_is(ctx):
    ev = _evaluated(ctx, MATCHED)
    assert rename_devices(ctx, ev, losses=False) is ev


@pytest.mark.parametrize("seed", range(12))
def test_every_label_is_a_permutation_that_keeps_the_waves_waves(seed):
    rng = random.Random(seed)
    n, per_node = rng.choice([(6, 2), (12, 4), (16, 8)])
    problem = random_problem(rng, n, rng.randint(2, 6))
    slice_memory, partners = _slices(problem, seed)
    weight = {o.id: rng.random() for o in problem.ops}
    topo = Topology(n, per_node, 10**9, partners, weight)
    waves = place(problem, cpa_schedule(problem), topo, PartLedger(n, slice_memory)).waves
    fake = SimpleNamespace(problem=problem, topology=topo)
    for cut in range(1, len(waves)):
        for prefix in (False, True):
            label = matching_label(fake, waves, cut, prefix)  # type: ignore[arg-type]
            if label is None:
                continue
            assert sorted(label) == list(range(n))
            for wave, old in zip(relabeled(waves, label, cut, prefix), waves, strict=True):
                assert [p.n for p in wave] == [p.n for p in old]
                ids = [d for p in wave for d in p.devices]
                assert len(ids) == len(set(ids))


# the projections crossed as above, and both LM sinks ending on devices 0-1
CROSSED_AND_PILED = (
    *CROSSED[:2],
    (_pp("caption/lm", 0, 4, (0, 1)),),
    (_pp("transcribe/lm", 0, 4, (0, 1)),),
)


def test_one_search_weighs_the_moves_and_the_losses_together(ctx):
    ev = _evaluated(ctx, CROSSED_AND_PILED)
    both = rename_devices(ctx, ev)
    inputs = rename_devices(ctx, ev, losses=False)
    losses = rename_devices(ctx, ev, inputs=False)
    # pairing the losses alone renames the LMs' devices off their inputs: more moves
    assert losses.timing.transfer_s > ev.timing.transfer_s
    assert losses.timing.loss_s < ev.timing.loss_s
    # the search over both kinds ends with no moves at all and the losses spread too
    assert both.timing.transfer_s == pytest.approx(0.0, abs=1e-12)
    assert both.timing.loss_s < ev.timing.loss_s
    assert both.iteration_s <= min(inputs.iteration_s, losses.iteration_s) * (1 + 1e-9)
    assert both.iteration_s < losses.iteration_s
    (note,) = both.schedule.notes
    assert note.startswith(RENAME_NOTE) and "transfers" in note and "losses" in note


@pytest.fixture
def priced(monkeypatch) -> list[int]:
    """One item per step pricing a renaming search makes from now on."""
    return count_calls(monkeypatch, relabel, "time_of")


def test_past_the_deadline_slow_pricings_end_the_renaming_search(ctx, priced, monkeypatch):
    """Once the planning call's deadline has passed, a search whose pricings count as slow
    prices at most ``LATE_TRIALS`` proposals; quick pricings run whatever the clock says."""
    before = _evaluated(ctx, CROSSED)
    unhurried = rename_devices(ctx, before, losses=False)
    assert len(priced) > 1 and unhurried.iteration_s < before.iteration_s
    priced.clear()
    late = rename_devices(ctx, before, losses=False, deadline=0.0)  # quick pricings
    assert late.iteration_s == unhurried.iteration_s and len(priced) > 1
    monkeypatch.setattr(relabel, "SLOW_PRICING_S", 0.0)  # every pricing counts as slow
    monkeypatch.setattr(relabel, "LATE_TRIALS", 1)
    priced.clear()
    one = rename_devices(ctx, before, losses=False, deadline=0.0)
    assert len(priced) == 1 and one.iteration_s < before.iteration_s  # the first proposal
    monkeypatch.setattr(relabel, "LATE_TRIALS", 0)
    priced.clear()
    assert rename_devices(ctx, before, losses=False, deadline=0.0) is before and not priced
    assert rename_devices(ctx, before, losses=False).iteration_s == unhurried.iteration_s


def test_a_renaming_search_past_its_late_trials_stops_at_the_deadline(ctx, priced, monkeypatch):
    """A search that has priced ``LATE_TRIALS`` proposals or more prices none that would
    end past the deadline: the late pricings are a least effort, not more time."""
    before = _evaluated(ctx, CROSSED)
    rename_devices(ctx, before, losses=False)
    unhurried = len(priced)
    assert unhurried > 3
    monkeypatch.setattr(relabel, "SLOW_PRICING_S", 0.0)  # every pricing counts as slow
    monkeypatch.setattr(relabel, "LATE_TRIALS", 2)
    monkeypatch.setattr(relabel, "time", SimpleNamespace(perf_counter=lambda: len(priced)))
    priced.clear()
    # each pricing takes one tick of this clock: the fourth would end past the deadline
    rename_devices(ctx, before, losses=False, deadline=4)
    assert len(priced) == 3
