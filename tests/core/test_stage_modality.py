"""An input stage is sized for the longest sequence any task feeds it, not the default."""

from spindle_dsl.language import compile_text

SPEC = """
modality text { tokens = 8  vocab = 100 }
shared lm : transformer(layers = 2, hidden = 32, heads = 2, causal = true, vocab = 100)
task short { text -> lm }
task long  { text[20] -> lm }
mix m { global_batch = 4; short = 1; long = 1 }
"""


def test_position_table_covers_the_longest_task():
    graph = compile_text(SPEC).graph
    assert graph.module("lm").raw_inputs == (("text", 20),)
    assert graph.stage_modality("lm", "text").tokens == 20
    assert graph.modality("text").tokens == 8  # the declared default is unchanged
    # 20 rows of positions of width 32 are counted in the module's parameters.
    without_long = compile_text(SPEC.replace("text[20]", "text")).graph
    assert graph.module("lm").params - without_long.module("lm").params == (20 - 8) * 32
