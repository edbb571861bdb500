"""``bench/gap_sensitivity.py``: its scaled cost model changes the optimizer's fixed work per
part and nothing else, and its table has a row per case and a cell per variant."""

from __future__ import annotations

import dataclasses

from benchload import load_bench

from spindle_dsl.cost.analytic import AnalyticCostModel
from spindle_dsl.language import compile_file

bench = load_bench("gap_sensitivity")


def _graph():
    path = bench.spec_path("flamingo_like")
    return compile_file(path, cluster_overrides={"devices": 8}).graph


def test_the_scaled_model_scales_the_per_part_work_alone() -> None:
    graph = _graph()
    plain = AnalyticCostModel(graph.cluster).step_model(graph).overheads
    half = bench.ScaledPartCost(graph.cluster, 0.5).step_model(graph).overheads
    assert plain.part_s > 0
    assert half.part_s == 0.5 * plain.part_s
    assert dataclasses.replace(half, part_s=plain.part_s) == plain
    # a part's work on one of several holders keeps its copies, which scale with its bytes
    nbytes = 1e6
    assert half.part_seconds("x", nbytes) - half.part_s == plain.part_seconds("x", nbytes) - (
        plain.part_s
    )


def test_no_per_part_work_lowers_the_bound() -> None:
    """The bound's optimizer floor holds each part's fixed work once: without it the bound
    falls (the plans themselves are time-limited searches, compared by the table, not here)."""
    it_plain, bound_plain = bench.ratio("flamingo_like@8", 0.5, None)
    it_free, bound_free = bench.ratio("flamingo_like@8", 0.5, 0.0)
    assert bound_free < bound_plain
    assert bound_plain <= it_plain and bound_free <= it_free


def test_the_table_has_a_cell_per_variant(capsys) -> None:
    argv = ["flamingo_like@8", "--times", "2", "--parts", "0", "--time-limit", "0.3"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:2] == ["workload", "N"]
    assert "time x2" in out[1] and "part x0" in out[1]
    cells = out[2].split()
    assert cells[:2] == ["flamingo_like", "8"]
    assert len(cells) == 2 + 3 + 1  # three variants and the plan's iteration
    assert out[-1].split()[:2] == ["within", "(*)"]
