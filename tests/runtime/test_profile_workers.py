"""``spindle profile --nproc 2``: the step's figures measured on gloo workers, then used."""

from __future__ import annotations

import json

from spindle_dsl.cli import main
from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.profile import Profile
from spindle_dsl.language import compile_file

SPEC = """
cluster { devices = 2; device = "cpu" }
modality text  { tokens = 8; vocab = 32 }
modality audio { tokens = 6; features = 4 }
encoder ear : transformer(layers = 1, hidden = 16, heads = 2) <- audio
module  lm  : transformer(layers = 2, hidden = 16, heads = 2, causal = true, vocab = 32)
task listen { audio -> ear -> lm; text -> lm; loss = lm; batch = 4 }
"""


def _profile(tmp_path, capfd, text: str = SPEC):
    """``spindle profile`` of ``text`` on 2 workers: (spec path, profile path, stdout,
    stderr)."""
    spec = tmp_path / "s.spindle"
    spec.write_text(text)
    out_file = tmp_path / "p.json"
    code = main(["profile", str(spec), "--nproc", "2", "--points", "2", "--out", str(out_file)])
    out, err = capfd.readouterr()
    assert code == 0, err
    return spec, out_file, out, err


def test_profile_on_workers_measures_the_whole_step(tmp_path, capfd) -> None:
    spec, out_file, out, err = _profile(tmp_path, capfd)
    assert "2 gloo worker processes" in out and "step overheads" in out
    assert "profile [" in err  # the progress bar (a line per item off a terminal)
    profile = Profile.read(out_file)
    assert profile.nproc == 2 and profile.backend == "gloo"
    o = profile.overheads
    assert o is not None and o.source == str(out_file)
    for collective in (o.all_reduce, o.reduce_scatter, o.all_gather):
        assert [g for g, _ in collective.fits] == [2]
        assert collective.seconds(1 << 20, 2) > 0
    assert o.p2p.at(1 << 20) > 0 and o.optimizer.at(1 << 20) > 0 and o.wave_s > 0
    # every input stage and loss head of the spec was measured under the step model's key
    graph = compile_file(str(spec)).graph
    step = make_cost_model(graph.cluster, out_file).step_model(graph)  # type: ignore[attr-defined]
    for op in step.ops.values():
        assert all(o.input_line(s.key) is not None for s in op.inputs)
    assert all(o.loss_line(s.key) is not None for s in step.sinks)
    # and the plan prices the step with it
    plan_file = tmp_path / "plan.json"
    assert main(["plan", str(spec), "--profile", str(out_file), "--out", str(plan_file)]) == 0
    plan = json.loads(plan_file.read_text())
    assert plan["step_model"]["source"] == str(out_file)
    assert abs(sum(plan["breakdown"].values()) - plan["iteration_s"]) < 1e-12
    assert plan["breakdown"]["loss_s"] > 0 and plan["breakdown"]["optimizer_s"] > 0


def test_the_workers_time_tensor_parallel_layers_and_the_plan_prices_them(tmp_path, capfd) -> None:
    """Each shape the runtime can split 2-way is also timed as a 2-way group of the workers
    runs it; ``--tp 2`` then prices the layout from that entry, not from an estimate."""
    spec, out_file, _out, err = _profile(tmp_path, capfd)
    assert "2-way tensor parallel" in err  # the progress bar names the points
    profile = Profile.read(out_file)
    graph = compile_file(str(spec)).graph
    for op in graph.metaops:
        entry = profile.lookup(op, 2)
        assert entry is not None and entry.samples and profile.lookup(op) is not None
        assert all(s.seconds > 0 for s in entry.samples)
    lm = graph.op("listen/lm")
    model = make_cost_model(graph.cluster, out_file, tp=2)
    curve = model.curves(graph)[lm.id]  # type: ignore[attr-defined]
    assert curve.layout(2) == (1, 2)
    work = 3 * lm.forward_flops_per_layer / 2  # the whole batch's per-device share
    assert curve.at(2) == profile.lookup(lm, 2).fit.predict(work)  # type: ignore[union-attr]


def test_more_ranks_than_cores_measures_what_taking_turns_costs(tmp_path, capfd, monkeypatch):
    """2 ranks on 1 core (``SPINDLE_CORES=1``, which the workers inherit): the profile times
    one layer on one rank, then on both at once, and keeps what the sharing costs beyond the
    fair share; the step model prices crowded waves with it."""
    from spindle_dsl.cluster import CORES_ENV

    monkeypatch.setenv(CORES_ENV, "1")
    spec, out_file, _out, err = _profile(tmp_path, capfd)
    assert "2 ranks taking turns on 1 cores" in err
    o = Profile.read(out_file).overheads
    assert o is not None and o.cores == 1 and o.sharing_slowdown >= 1.0
    graph = compile_file(str(spec)).graph
    step = make_cost_model(graph.cluster, out_file).step_model(graph)  # type: ignore[attr-defined]
    assert step.cores == 1 and step.overheads.sharing_slowdown == o.sharing_slowdown
    # a 2-way group on one core would time the OS taking turns: no tensor-parallel layer
    assert all(e.tp == 1 for e in Profile.read(out_file).entries)


FROZEN = """
cluster { devices = 2; device = "cpu" }
modality text  { tokens = 8; vocab = 32 }
modality audio { tokens = 6; features = 4 }
encoder ear   : transformer(layers = 1, hidden = 16, heads = 2) <- audio frozen
module  adapt : mlp(in = 16, out = 16, hidden = 32, layers = 2)
module  lm    : transformer(layers = 2, hidden = 16, heads = 2, causal = true, vocab = 32)
task listen { audio -> ear -> adapt -> lm; text -> lm; loss = lm; batch = 4 }
"""


def test_the_workers_measure_the_first_layer_of_an_adapter_after_a_frozen_tower(
    tmp_path, capfd
) -> None:
    _, out_file, _, _ = _profile(tmp_path, capfd, FROZEN)
    entries = Profile.read(out_file).entries
    ratios = {e.metaops: e.first_layer_ratio for e in entries if e.tp == 1}
    assert ratios[("listen/ear",)] is None and ratios[("listen/lm",)] is None
    ratio = ratios[("listen/adapt",)]
    assert ratio is not None and 0.0 < ratio <= 1.0
