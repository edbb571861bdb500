"""Planning at the edges of what the language allows: huge time spreads, huge clusters."""

from __future__ import annotations

from spindle_dsl.cost import make_cost_model
from spindle_dsl.language import compile_text
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
    """Regression (issue 12, ``KeyError: 'image_text/image_head'`` in crosslevel's
    ``_try_wave``): the task-parallel start cut its time axis with a relative tolerance, so
    the 0.5 ms head after 10^6 s of text encoder got no wave, and ``backfill`` looked it up.
    The same path, with numbers the checker accepts."""
    graph = compile_text(SPREAD).graph
    plan = make_plan(graph, make_cost_model(graph.cluster))
    assert validate_plan(plan) == []
    assert {m.id for m in plan.metaops} == {op.id for op in graph.metaops}
