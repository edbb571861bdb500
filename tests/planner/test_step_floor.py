"""The step floors under the LP bound: below every placement's step terms, tight where they
can be, and part of the plan's lower bound."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from spindle_dsl.cli.cmd_plan import summary, summary_text
from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.overheads import Collective, Line, StepOverheads
from spindle_dsl.cost.step import PieceTime, make_step_model
from spindle_dsl.language import compile_text
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner import make_plan
from spindle_dsl.planner.bound.floors import NO_FLOOR, holder_groups, step_floor

SPEC = """
cluster { devices = 8; device = "cpu" }
modality image { tokens = 16 }
modality text  { tokens = 12; vocab = 64 }
encoder vision : vit(layers = 2, hidden = 32, heads = 2, patch = 4) <- image
encoder words  : transformer(layers = 2, hidden = 32, heads = 2) <- text
shared  lm     : transformer(layers = 3, hidden = 32, heads = 2, causal = true, vocab = 64)
module  proj   : mlp(in = 32, out = 32)
task caption { image -> vision -> proj -> lm; text -> lm; loss = lm }
task chat    { text -> lm; loss = lm }
task match   { image -> vision; text -> words; loss = contrastive }
mix default { global_batch = 24; caption = 1; chat = 1; match = 1 }
"""

ONE_SINK = """
cluster { devices = 8; device = "cpu" }
modality text  { tokens = 12; vocab = 64 }
shared  lm     : transformer(layers = 3, hidden = 32, heads = 2, causal = true, vocab = 64)
task chat    { text -> lm; loss = lm }
mix default { global_batch = 20; chat = 1 }
"""


def overheads(**changes) -> StepOverheads:
    """Every term of the step costs something: losses and inputs by FLOPs, AdamW by bytes,
    per-part copies, collectives."""
    line = Line(1e-4, 1e-9)
    base = StepOverheads(
        source="test",
        all_reduce=Collective(((2, line),)),
        reduce_scatter=Collective(((2, line),)),
        all_gather=Collective(((2, line),)),
        p2p=Line(0.0, 0.0),
        optimizer=Line(2e-4, 3e-9),
        copy_s_per_byte=1e-10,
        wave_s=1e-5,
        seconds_per_flop=1e-9,
        part_s=5e-5,
    )
    return replace(base, **changes)


def _random_waves(g, rng: random.Random, devices: int) -> list[list[PieceTime]]:
    """Every MetaOp in one to three pieces, each on a random block of devices, pieces of one
    wave on disjoint blocks, in dependency order (ops are listed after their inputs)."""
    waves: list[list[PieceTime]] = []
    for op in g.metaops:
        cuts = sorted(rng.sample(range(1, op.layers), min(op.layers - 1, rng.randint(0, 2))))
        bounds = [0, *cuts, op.layers]
        for first, end in itertools.pairwise(bounds):
            n = rng.randint(1, devices)
            start = rng.randint(0, devices - n)
            piece = PieceTime(op.id, first, end, tuple(range(start, start + n)), 0.01)
            last = waves[-1] if waves else None
            free = last is not None and all(
                p.op != op.id and not set(p.devices) & set(piece.devices) for p in last
            )
            if free and rng.random() < 0.5 and first == 0 and not _depends(g, op, last):
                last.append(piece)
            else:
                waves.append([piece])
    return waves


def _depends(g, op, wave: list[PieceTime]) -> bool:
    return any(p.op in op.deps for p in wave)


@pytest.mark.parametrize("seed", range(6))
def test_floors_are_below_every_placement(seed: int) -> None:
    """Random placements, micro-batch counts and ZeRO stages: each priced step term is at
    least its floor (a floor set too high fails here)."""
    g = compile_text(SPEC).graph
    rng = random.Random(seed)
    step = make_step_model(g, overheads(), grad_in_curves=False)
    for _ in range(25):
        waves = _random_waves(g, rng, g.cluster.devices)
        k = rng.choice((1, 2, 3, 5))
        zero = rng.choice((0, 1, 2))
        price = step.price(waves, micro_batches=k, zero_stage=zero)
        floor = step_floor(step, k)
        assert floor.loss_s > 0 and floor.optimizer_s > 0
        assert price.loss_s >= floor.loss_s * (1 - 1e-12)
        assert price.optimizer_s >= floor.optimizer_s * (1 - 1e-12)
        assert price.closing_s == pytest.approx(floor.closing_s)
        # the split the LP weighs: per-layer holder work over N plus the rest
        held = lp_holder_work(floor, waves)
        assert floor.holder_work and floor.holder_groups and floor.rest_s > 0
        assert price.optimizer_s >= (floor.rest_s + held / g.cluster.devices) * (1 - 1e-12)


def lp_holder_work(floor, waves) -> float:
    """The holder work the LP charges these waves, summed over the devices: each op's layers
    times devices at its own weight, and each group's widest member's at the group's."""
    layer_devices: dict[str, int] = {}
    for w in waves:
        for p in w:
            layer_devices[p.op] = layer_devices.get(p.op, 0) + (p.end - p.first) * len(p.devices)
    alone = sum(
        n * floor.holder_work[op] for op, n in layer_devices.items() if op in floor.holder_work
    )
    grouped = sum(
        work * max(layer_devices.get(op, 0) for op in ops) for ops, work in floor.holder_groups
    )
    return alone + grouped


def test_groups_are_the_ops_that_share_all_their_parts_and_no_one_else() -> None:
    """Each task's pass through a shared module is a group, weighed by the least work each
    of several holders pays for its parts, undivided; an op that also runs a part of its own
    (words, proj) is in none; and where a third op runs only some of a group's parts, that
    group is void."""
    g = compile_text(SPEC).graph
    step = make_step_model(g, overheads(), grad_in_curves=False)
    groups = dict(holder_groups(step))
    assert set(groups) == {("caption/lm", "chat/lm"), ("caption/vision", "match/vision")}
    o = step.overheads
    least = min(o.part_shared_least_seconds(k, b) for k, b in step.ops["chat/lm"].layer_parts)
    assert groups["caption/lm", "chat/lm"] == pytest.approx(least)
    floor = step_floor(step, 1)
    assert not {"caption/lm", "chat/lm", "caption/vision", "match/vision"} & set(floor.holder_work)
    assert {"match/words", "caption/proj"} <= set(floor.holder_work)
    # a third op over the lm's first layer only: the lm's parts are no longer the group's own
    ops = dict(step.ops)
    chat = ops["chat/lm"]
    ops["probe/lm"] = replace(chat, layer_parts=chat.layer_parts[:1])
    assert ("caption/lm", "chat/lm") not in dict(holder_groups(replace(step, ops=ops)))


def test_loss_floor_is_reached_by_one_sink_on_every_device() -> None:
    """One LM sink whose last entry spans all devices pays exactly the floor: the floor is
    not looser than it must be."""
    g = compile_text(ONE_SINK).graph
    step = make_step_model(g, overheads(), grad_in_curves=False)
    everyone = tuple(range(g.cluster.devices))
    waves = [[PieceTime(op.id, 0, op.layers, everyone, 0.01)] for op in g.metaops]
    for k in (1, 2, 4):
        price = step.price(waves, micro_batches=k)
        assert price.loss_s == pytest.approx(step_floor(step, k).loss_s, rel=1e-12)
    narrow = [[PieceTime(op.id, 0, op.layers, (0, 1), 0.01)] for op in g.metaops]
    assert step.price(narrow).loss_s > step_floor(step, 1).loss_s * 1.5


def test_a_negative_optimizer_slope_gets_no_floor() -> None:
    g = compile_text(SPEC).graph
    step = make_step_model(g, overheads(optimizer=Line(1e-3, -1e-12)), grad_in_curves=False)
    assert step_floor(step, 1).optimizer_s == 0.0
    assert step_floor(None, 4) == NO_FLOOR


def test_the_plan_bound_adds_the_floors_and_stays_below_the_plan() -> None:
    """The plan's lower bound is the LP plus the floors at some k tried: above the LP alone
    by at least the least floor, below the plan; the LP alone still bounds the compute."""
    g = compile_text(SPEC).graph
    cost = make_cost_model(g.cluster)
    plan = make_plan(g, cost, time_limit_s=0.3)
    b = plan.extra["bounds"]
    step = cost.step_model(g)
    least = min(step_floor(step, k).total_s(k) for k in b["micro_batches"])
    assert b["lp_s"] is not None and least > 0
    assert plan.lower_bound_s >= b["lp_s"] + least * (1 - 1e-9)
    assert b["step_floor_s"] >= least * (1 - 1e-9)
    assert b["lp_s"] <= dict(plan.breakdown)["compute_s"] * (1 + 1e-9)
    assert plan.lower_bound_s <= plan.iteration_s and validate_plan(plan) == []
    text = summary_text(summary(plan))
    assert f"{b['step_floor_s'] * 1e3:.2f} ms of step floors" in text


def test_a_layer_shared_by_several_metaops_counts_once() -> None:
    """Every MetaOp on every device: each layer part is held once per device, however many
    MetaOps run it, and the LP's per-layer holder work adds up to exactly that, at the price
    each of several holders pays."""
    g = compile_text(SPEC).graph
    step = make_step_model(g, overheads(), grad_in_curves=False)
    assert sum(1 for o in g.metaops if o.segments[0][0] == "lm") > 1  # lm is shared
    everyone = tuple(range(g.cluster.devices))
    waves = [[PieceTime(op.id, 0, op.layers, everyone, 0.01)] for op in g.metaops]
    floor = step_floor(step, 1)
    held = lp_holder_work(floor, waves) / len(everyone)
    layer_parts = {key: b for op in step.ops.values() for key, b in op.layer_parts if b > 0}
    once = sum(step.overheads.part_shared_least_seconds(k, b) for k, b in layer_parts.items())
    assert held == pytest.approx(once, rel=1e-12)
    assert step.price(waves).optimizer_s >= floor.rest_s + held * (1 - 1e-12)
