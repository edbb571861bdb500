"""``bench/wave_optimum.py`` on a small spec: the long solve starts from the leaner of the
plan's and the scheduler's waves, so its compute is never above that start's, and the LP
bound is below every one of them (each a schedule of the same problem)."""

from __future__ import annotations

from benchload import load_bench

bench = load_bench("wave_optimum")


def test_the_solve_never_ends_above_its_start_nor_below_the_lp() -> None:
    r = bench.row("flamingo_like@8", milp_s=0.5, time_limit=0.5)
    assert r["start_c"] <= r["plan_c"] * (1 + 1e-9)
    assert r["milp_c"] <= r["start_c"] * (1 + 1e-9)
    assert r["lp"] <= r["milp_c"] * (1 + 1e-9)
    # every iteration is above the plan's bound, placed and timed alike
    assert r["bound"] <= min(r["plan_it"], r["milp_it"], r["reported"]) * (1 + 1e-9)


def test_the_table_names_each_case(capsys) -> None:
    assert bench.main(["flamingo_like@8", "--milp-seconds", "0.3", "--time-limit", "0.3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == ["workload", "N", "k"]
    assert out[2].split()[:2] == ["flamingo_like", "8"]
