"""``bench/predict_accuracy.py``'s tables from rows of runs (no training here): default over
sequential is the median of each case's pairs of runs, a cycle's turns each a pair."""

from __future__ import annotations

from benchload import load_bench

bench = load_bench("predict_accuracy")


def _row(plan: str, cycle: int, turn: int, measured: float) -> dict:
    """A row as ``run_case`` makes it (a 0.1 s prediction)."""
    return {
        "spec": "tiny_mm",
        "ranks": 2,
        "plan": plan,
        "cycle": cycle,
        "turn": turn,
        "drift": 1.0,
        "predicted_s": 0.1,
        "measured_s": measured,
        "profile_s": 8.0,
        "load_profile": 1.0,
        "load_after": 1.5,
        "worst_term": "-",
        "peak_ratios": [0.99, 1.0],
    }


def _pairs(ratios: list[float]) -> list[dict]:
    """Two cycles of turns whose default/sequential ratios are ``ratios``, in order."""
    rows = []
    for i, ratio in enumerate(ratios):
        cycle, turn = divmod(i, 2)
        rows += [_row("sequential", cycle, turn, 0.1), _row("default", cycle, turn, 0.1 * ratio)]
    return rows


def test_default_over_sequential_is_the_median_of_the_pairs(capsys) -> None:
    bench.print_default_vs_sequential(_pairs([0.9, 1.3, 1.0, 0.95]))
    out = capsys.readouterr().out
    # every pair a cycle and turn of its own; the median of 0.9, 0.95, 1.0, 1.3 is 0.975
    assert "tiny_mm@2: 0.97  ok  (0.90, 1.30, 1.00, 0.95)" in out


def test_a_case_whose_pairs_run_slower_is_flagged(capsys) -> None:
    bench.print_default_vs_sequential(_pairs([1.2, 1.15, 1.05]))
    assert "tiny_mm@2: 1.15  SLOWER" in capsys.readouterr().out


def test_rows_and_medians_print_every_run(capsys) -> None:
    rows = _pairs([1.0, 1.4])
    bench.print_rows(rows, cores=2)
    bench.print_medians(rows, cores=2)
    out = capsys.readouterr().out
    assert out.count("tiny_mm") == 4 + 2  # a line per run, a median per plan
    assert " 1.1 " in out and " 1.2 " in out  # cycle 1, turns 1 and 2
    # default measured 0.10 and 0.14 s against 0.1 s: its median, 1.20, within 25%
    assert "default          1.20" in out and "ok (within 25%)" in out
    assert "1.40  MISS" in out  # the 0.14 s run alone misses
