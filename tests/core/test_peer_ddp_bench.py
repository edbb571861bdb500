"""``bench/peer_ddp.py`` in its smallest form, so the peer benchmark stays runnable: tiny_mm on
2 ranks, 3 steps, one round of DDP, FSDP2 and ``spindle train``'s two plans."""

from __future__ import annotations

import json

import pytest
from benchload import REPO, load_bench

bench = load_bench("peer_ddp")


@pytest.mark.slow
def test_the_peer_bench_prints_its_table_and_the_losses_agree(tmp_path, capsys) -> None:
    figures = tmp_path / "peer.json"
    spec = REPO / "examples" / "tiny_mm.spindle"
    argv = [str(spec), "--nproc", "2", "--steps", "3", "--repeat", "1", "--json", str(figures)]
    code = bench.main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "DDP step s" in out and "sequential step s" in out
    assert "where a step goes" in out
    (row,) = json.loads(figures.read_text())["rows"]
    assert (row["spec"], row["ranks"]) == ("tiny_mm", 2)
    assert {"ddp", "default", "sequential"} <= row["steps"].keys()
    assert "fsdp" in row["steps"] or "fsdp" in row["errors"]  # run, or left out with its reason
    # the same model, seed and samples: first-step losses agree to float32 rounding
    assert row["loss_rel"] <= bench.LOSS_RTOL
    assert f"ok ({row['loss_rel']:.1e}" in out
