"""Planning at the edges of what the language allows: huge time spreads, huge clusters."""

from __future__ import annotations

import warnings

import pytest

from spindle_dsl.cost import make_cost_model
from spindle_dsl.errors import PlanError
from spindle_dsl.language import compile_file, compile_text
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner import make_plan

# Every number within the language's limits; the text encoder's layers take about 10^5 s each
# on these slow devices while the head's single layer takes 0.5 ms (a spread of 10^9).
SPREAD = """
cluster { devices = 8; device = "cpu"; memory = 1024GB; tflops = 0.01 }
modality image { tokens = 1 }
modality text  { tokens = 4096  vocab = 32000 }
encoder pixel : vit(layers = 1, hidden = 8, heads = 1, patch = 1) <- image
module  head  : mlp(in = 8, out = 8)
shared  text_enc : transformer(layers = 32, hidden = 4096, heads = 32, vocab = 32000) <- text
task match { image -> pixel -> head; text -> text_enc; loss = mse }
task other { image -> pixel -> head; text[64] -> text_enc; loss = mse }
mix m { global_batch = 256; match = 1; other = 1 }
"""


def test_a_tiny_op_behind_a_huge_one_is_planned():
    """A 0.5 ms head after 10^6 s of text encoder, through the whole planner: a time axis cut
    with a relative tolerance would give the head no wave, and the improvements would then
    fail looking it up. Every MetaOp must be planned, with numbers the checker accepts."""
    graph = compile_text(SPREAD).graph
    plan = make_plan(graph, make_cost_model(graph.cluster))
    assert validate_plan(plan) == []
    assert {m.id for m in plan.metaops} == {op.id for op in graph.metaops}


LARGEST = """
cluster { devices = 65536; device = "cpu"; devices_per_node = 1024; tflops = 100000;
          memory = 16384GB; intra_bandwidth = 100000GB/s; inter_bandwidth = 0.001GB/s }
modality image { tokens = 1048576 }
modality audio { tokens = 1048576  features = 65536 }
modality text  { tokens = 1048576  vocab = 4194304 }
encoder vision  : vit(layers = 4096, hidden = 131072, heads = 1024, patch = 1024) <- image
encoder hearing : transformer(layers = 4096, hidden = 131072, heads = 1024) <- audio
module  proj    : mlp(in = 131072, out = 131072, hidden = 131072, layers = 4096)
shared  lm : transformer(layers = 4096, hidden = 131072, heads = 1024, causal = true,
                         vocab = 4194304)
task caption { image -> vision -> proj -> lm; text -> lm }
task listen  { audio -> hearing -> lm; text[1048576] -> lm }
mix m { global_batch = 16777216; caption = 1000000; listen = 1 }
"""


def test_every_number_at_its_limit_ends_in_a_plan_error_not_an_overflow():
    """Sizes of 2^80 bytes and more: exact integers, finite floats, no NaN cast (warnings
    are errors here), and a plan error that says what does not fit."""
    graph = compile_text(LARGEST).graph
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(PlanError, match="does not fit"):
            make_plan(graph, make_cost_model(graph.cluster), time_limit_s=0.2)


def test_four_thousand_layers_plan_in_a_few_waves(spec_dir):
    """A MetaOp of 4,096 layers costs the planner what one of 4 does: waves, not layers."""
    text = (spec_dir / "multitask_clip.spindle").read_text()
    text = text.replace("layers = 24, hidden = 1024", "layers = 4096, hidden = 1024")
    # its 4,096 layers' weights, held whole on every rank, need more than a GPU's 80 GiB
    overrides = {"devices": 1024, "memory_bytes": 512 * 2**30}
    graph = compile_text(text, cluster_overrides=overrides).graph
    plan = make_plan(graph, make_cost_model(graph.cluster), time_limit_s=0.2)
    assert validate_plan(plan) == []
    assert max(m.layers for m in plan.metaops) == 4096
    assert len(plan.waves) < 60


@pytest.mark.parametrize("scheduler", ["default", "paper", "sequential", "distmm", "optimus"])
def test_on_a_large_cluster_every_entry_uses_a_listed_allocation(spec_dir, scheduler):
    """Curves list a few hundred of the 4,096 allocations; every scheduler allocates only
    those (``validate_plan`` checks each entry's device count against its curve)."""
    graph = compile_file(
        spec_dir / "multitask_clip.spindle", cluster_overrides={"devices": 4096}
    ).graph
    plan = make_plan(graph, make_cost_model(graph.cluster), scheduler=scheduler, time_limit_s=0.3)
    assert validate_plan(plan) == []
    for m in plan.metaops:
        assert len(m.seconds_per_layer) < 600
    listed = {m.id: dict(m.seconds_per_layer) for m in plan.metaops}
    assert all(len(e.devices) in listed[e.metaop] for w in plan.waves for e in w.entries)
