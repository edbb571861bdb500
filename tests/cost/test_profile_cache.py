"""The per-machine profile cache behind ``spindle plan``/``train`` on cpu clusters.

Most tests stand a fake in for the measurement on worker processes (``measure_on_workers``):
it answers with figures for exactly what it was asked to measure, and records what that was,
so that a test can say what a run measured, or that it measured nothing. One slow test
measures for real, on two worker processes.
"""

from __future__ import annotations

import argparse
import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from spindle_dsl.cli import calibration, main
from spindle_dsl.cli.calibration import NO_CACHE_ENV, Calibration, uncalibrated_text
from spindle_dsl.cost.machine import MachineKey, cpu_model, worker_threads
from spindle_dsl.cost.overheads import StepOverheads, analytic_overheads
from spindle_dsl.cost.profile import Profile, shape_key
from spindle_dsl.cost.profile_cache import (
    CACHE_ENV,
    CachedProfile,
    cache_dir,
    cache_path,
    read_cache,
    write_cache,
)
from spindle_dsl.cost.profile_needs import ProfileNeeds, ProfileSelection
from spindle_dsl.cost.profiler import (
    needs_first_layer_ratio,
    shape_entry,
    shape_groups,
    tp_batches,
)
from spindle_dsl.cost.step_parts import op_steps, sink_losses
from spindle_dsl.errors import ExecutionError
from spindle_dsl.language import compile_file
from spindle_dsl.metagraph import MetaGraph

PLAN = ["--devices", "2", "--quiet", "--scheduler", "paper"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache on (the suite turns it off), in a folder of this test's."""
    folder = tmp_path / "cache"
    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


def fake_profile(graph: MetaGraph, ranks: int, selection: ProfileSelection) -> Profile:
    """What a profiling run of ``selection`` returns, with made-up figures: a layer takes
    1 ms per sample (a K-way tensor-parallel one a K-th of that), the step's other terms keep
    the analytic figures."""
    entries = tuple(
        shape_entry(
            ops,
            [(b, 1e-3 * b / tp) for b in tp_batches(ops, graph.cluster.devices, tp, 5)],
            0.9 if tp == 1 and needs_first_layer_ratio(graph, ops) else None,
            tp=tp,
        )
        for ops in shape_groups(graph)
        for tp in range(1, graph.cluster.devices + 1)
        if shape_key(ops[0], tp) in selection.shapes
    )
    d = analytic_overheads(graph.cluster).to_dict()
    line = {"alpha_s": 1e-4, "beta_s": 1e-5}
    stages = {s.key for op in op_steps(graph).values() if op.batch > 0 for s in op.inputs}
    d["inputs"] = {k: line for k in stages if k in selection.inputs}
    d["losses"] = {s.key: line for s in sink_losses(graph) if s.key in selection.losses}
    d["parts"] = d["parts_alone"] = {c: 1e-4 for c in selection.parts}
    return Profile("cpu", "cpu", "t", 1, "float32", graph.spec_path, entries, ranks, "gloo",
                   StepOverheads.from_dict(d, "profile"))  # fmt: skip


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ProfileSelection]]:
    """The fake measurement in place; each call's (ranks, selection) in order."""
    calls: list[tuple[int, ProfileSelection]] = []

    def measure(graph: MetaGraph, ranks: int, selection: ProfileSelection) -> Profile:
        calls.append((ranks, selection))
        return fake_profile(graph, ranks, selection)

    monkeypatch.setattr(calibration, "measure_on_workers", measure)
    return calls


def no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: object) -> Profile:
        raise AssertionError("measured although the cache has everything")

    monkeypatch.setattr(calibration, "measure_on_workers", refuse)


def the_cache_file(folder: Path, ranks: int = 2) -> Path:
    return folder / MachineKey.here(ranks).file_name()


# --- the machine key and the folder ---------------------------------------------------------


def test_the_machine_key_names_what_makes_timings_comparable(tmp_path, monkeypatch) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Acme(R) Core(TM) X9 @ 3.0GHz\nflags\t: x\n")
    assert cpu_model(info) == "Acme(R) Core(TM) X9 @ 3.0GHz"
    assert cpu_model(tmp_path / "absent")  # falls back to what platform says
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert worker_threads() == 3
    key = MachineKey.here(4)
    assert (key.threads, key.ranks) == (3, 4) and key.cores >= 1 and key.torch
    # every field tells keys apart, and the file name is safe to write anywhere
    others = [replace(key, **{f: v}) for f, v in (("cpu", "other"), ("cores", key.cores + 1),
              ("torch", "0.0"), ("threads", 1), ("ranks", 2))]  # fmt: skip
    names = {k.file_name() for k in (key, *others)}
    assert len(names) == 6
    assert all(n.endswith(".json") and set(n) <= set("abcdefghijklmnopqrstuvwxyz0123456789.-")
               for n in names)  # fmt: skip
    assert MachineKey.from_dict(key.to_dict()) == key


def test_the_cache_folder_follows_the_environment(tmp_path) -> None:
    assert cache_dir({CACHE_ENV: str(tmp_path)}) == tmp_path
    assert cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/spindle")
    assert cache_dir({}) == Path.home() / ".cache" / "spindle"
    key = MachineKey("cpu", 2, "2.0", 1, 2)
    assert cache_path(key, {CACHE_ENV: str(tmp_path)}) == tmp_path / key.file_name()


def test_the_suite_never_writes_into_the_users_cache() -> None:
    import os

    assert os.environ.get(NO_CACHE_ENV) == "1"
    assert Path(os.environ[CACHE_ENV]) != Path.home() / ".cache" / "spindle"


# --- plan and train with the cache ----------------------------------------------------------


def test_a_second_run_reuses_the_cache_without_measuring(
    cache, measured, monkeypatch, spec_dir, capfd
) -> None:
    spec = str(spec_dir / "tiny_mm.spindle")
    assert main(["plan", spec, *PLAN]) == 0
    out, err = capfd.readouterr()
    assert [ranks for ranks, _ in measured] == [2]  # one worker process per device
    first = measured[0][1]
    # the 6 layer shapes, and each of them 2-way tensor parallel
    assert sorted(key[-1] for key in first.shapes) == [1] * 6 + [2] * 6
    assert first.machine and first.inputs and first.losses
    assert "profiling this machine" in err and "cost model: the cached profile" in err
    assert "uncalibrated" not in out
    assert the_cache_file(cache).is_file()

    no_measuring(monkeypatch)
    assert main(["plan", spec, *PLAN, "--json"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["uncalibrated"] is None
    assert err.count("cost model: the cached profile of this machine") == 1
    assert "profiling" not in err


def test_a_spec_with_one_new_shape_measures_only_that_shape(
    cache, measured, tmp_path, spec_dir, capfd
) -> None:
    spec = str(spec_dir / "tiny_mm.spindle")
    assert main(["plan", spec, *PLAN]) == 0
    text = (spec_dir / "tiny_mm.spindle").read_text()
    wider = tmp_path / "wider.spindle"
    old = "module  audio_proj  : mlp(in = 48, out = 96)"
    assert old in text
    wider.write_text(
        text.replace(old, "module  audio_proj  : mlp(in = 48, out = 96, hidden = 200)")
    )
    assert main(["plan", str(wider), *PLAN]) == 0
    capfd.readouterr()
    graph = compile_file(str(wider), cluster_overrides={"devices": 2}).graph
    op = graph.op("transcribe/audio_proj")
    new = {shape_key(op), shape_key(op, 2)}  # and its 2-way tensor-parallel layer
    assert measured[1][1] == ProfileSelection(shapes=frozenset(new),
                                              parts=frozenset({"audio_proj/layer"}))  # fmt: skip
    # both specs' shapes are in the file now
    cached, warning = read_cache(the_cache_file(cache), MachineKey.here(2))
    assert warning is None and len(cached.profile.entries) == 14


def test_a_larger_batch_measures_the_shapes_again_and_merges_the_samples(
    cache, measured, tmp_path, spec_dir, capfd
) -> None:
    spec = spec_dir / "tiny_mm.spindle"
    assert main(["plan", str(spec), *PLAN]) == 0
    bigger = tmp_path / "bigger.spindle"
    bigger.write_text(spec.read_text().replace("global_batch = 32", "global_batch = 128"))
    assert main(["plan", str(bigger), *PLAN]) == 0
    capfd.readouterr()
    again = measured[1][1]
    assert len(again.shapes) == 12 and not again.machine  # the fits would be read past samples
    cached, _ = read_cache(the_cache_file(cache), MachineKey.here(2))
    lm = next(e for e in cached.profile.entries if e.metaops == ("caption/lm",))
    assert [s.batch for s in lm.samples] == [12, 24, 48, 96]  # 32's (12, 24) and 128's (48, 96)


def test_a_schedule_is_priced_from_one_cache_for_all_its_phases(
    cache, measured, monkeypatch, spec_dir, capfd
) -> None:
    spec = str(spec_dir / "next" / "tiny_schedule.spindle")
    assert main(["plan", spec, *PLAN, "--jobs", "0"]) == 0
    out, err = capfd.readouterr()
    assert "uncalibrated" not in out and err.count("cost model: the cached profile") == 1
    # the first phase's run measures its terms; a later phase only what it adds (batch 48's
    # per-device batches lie past phase 1's samples)
    assert measured[0][1].machine and all(not s.machine for _, s in measured[1:])
    no_measuring(monkeypatch)
    assert main(["plan", spec, *PLAN, "--jobs", "0"]) == 0
    assert "uncalibrated" not in capfd.readouterr().out


def test_train_measures_on_its_worker_processes(cache, measured, monkeypatch, spec_dir) -> None:
    from spindle_dsl.backends import torch as backend

    plans: list = []

    def fake_train(self, graph, plan, config, *, planner=None, **_):
        plans.append(planner())

    monkeypatch.setattr(backend.TorchBackend, "train", fake_train)
    spec = str(spec_dir / "tiny_mm.spindle")
    argv = ["train", spec, "--nproc", "3", "--steps", "1", "--scheduler", "paper"]
    assert main(argv) == 0
    assert [ranks for ranks, _ in measured] == [3]
    assert the_cache_file(cache, 3).is_file()
    # the plan was priced with the cached profile (its step model names the file)
    assert plans[0].extra["step_model"]["source"] == str(the_cache_file(cache, 3))


def test_no_cache_neither_reads_nor_writes_and_says_uncalibrated(
    cache, measured, monkeypatch, spec_dir, capfd
) -> None:
    spec = str(spec_dir / "tiny_mm.spindle")
    assert main(["plan", spec, *PLAN]) == 0
    before = {p: p.read_bytes() for p in cache.iterdir()}
    capfd.readouterr()

    def refuse(*_a: object) -> None:
        raise AssertionError("read the cache under --no-cache")

    no_measuring(monkeypatch)
    monkeypatch.setattr(calibration, "read_cache", refuse)
    monkeypatch.setattr(calibration, "write_cache", refuse)
    assert main(["plan", spec, *PLAN, "--no-cache"]) == 0
    out, err = capfd.readouterr()
    assert "the predicted step time is uncalibrated" in out and "--no-cache" in out
    assert "spindle profile" in out and "cached profile" not in err
    monkeypatch.setenv(NO_CACHE_ENV, "1")
    assert main(["plan", spec, *PLAN, "--json"]) == 0
    out, _ = capfd.readouterr()
    assert "SPINDLE_NO_CACHE" in json.loads(out)["uncalibrated"]
    assert {p: p.read_bytes() for p in cache.iterdir()} == before


def test_no_cache_on_an_empty_folder_creates_nothing(cache, measured, spec_dir, capfd) -> None:
    assert main(["plan", str(spec_dir / "tiny_mm.spindle"), *PLAN, "--no-cache"]) == 0
    assert not cache.exists() and measured == []
    assert "uncalibrated" in capfd.readouterr().out


def test_the_train_summary_says_uncalibrated_instead_of_a_ratio(capsys) -> None:
    from spindle_dsl.backends.base import RunResult, StepRecord
    from spindle_dsl.cli.cmd_train import _report

    steps = tuple(StepRecord(i, (("t", 1.0),), 1.7) for i in (1, 2, 3))
    result = RunResult(steps, 2, "gloo", 0, predicted_step_s=1.0)
    args = argparse.Namespace(spec="s.spindle", nproc=2, summary_json=None)
    _report(args, result, None, Calibration(uncalibrated="the profile cache is off: --no-cache",
                                            cache_off=True), None, False)  # fmt: skip
    out = capsys.readouterr().out
    row = this_plan_row(out)
    assert "1.70" not in row[-1] and "uncalibrated" in row[-1]  # no ratio, and why not
    assert "note: the predicted step time is uncalibrated" in out
    assert "spindle profile s.spindle --nproc 2" in out
    _report(args, result, None, Calibration(), None, False)
    out = capsys.readouterr().out
    assert this_plan_row(out)[-1] == "1.70" and "uncalibrated" not in out  # a real ratio


def this_plan_row(out: str) -> list[str]:
    """The summary's ``this plan`` row: the measured and predicted step, then the ratio (and
    whatever replaces it) in one last column."""
    line = next(x for x in out.splitlines() if x.startswith("  this plan"))
    measured, predicted, rest = line[len("  this plan") :].split(maxsplit=2)
    return [measured, predicted, rest]


def test_the_uncalibrated_statement_says_how_to_calibrate() -> None:
    off = Calibration(uncalibrated="the profile cache is off: --no-cache", cache_off=True)
    text = uncalibrated_text(off, "examples/tiny_mm.spindle", 4)
    assert "analytic" in text and "first guess" in text and "--no-cache" in text
    assert "spindle profile examples/tiny_mm.spindle --nproc 4 --out profile.json" in text
    assert "--profile profile.json" in text
    far = Calibration(uncalibrated="the cluster spans 8 nodes")
    assert "--no-cache" not in uncalibrated_text(far, "s.spindle", None)
    assert "--nproc" not in uncalibrated_text(far, "s.spindle", None)


# --- where the cache cannot be made --------------------------------------------------------


def test_a_cluster_too_large_to_spawn_here_falls_back(cache, measured, spec_dir, capfd) -> None:
    spec = str(spec_dir / "tiny_mm.spindle")
    argv = ["plan", spec, "--quiet", "--scheduler", "paper", "--devices", "64"]
    assert main([*argv, "--devices-per-node", "64"]) == 0
    out, err = capfd.readouterr()
    assert "uncalibrated" in out and "more worker processes than this machine" in out
    assert main(argv) == 0  # 8 nodes of 8
    out, err = capfd.readouterr()
    assert "uncalibrated" in out and "spans 8 nodes" in out
    assert measured == [] and not cache.exists() and "Traceback" not in err


@pytest.mark.parametrize("failure", [ExecutionError("rank 1 died"), RuntimeError("gloo")])
def test_a_failed_measurement_falls_back(cache, monkeypatch, spec_dir, capfd, failure) -> None:
    def fail(*_a: object) -> Profile:
        raise failure

    monkeypatch.setattr(calibration, "measure_on_workers", fail)
    assert main(["plan", str(spec_dir / "tiny_mm.spindle"), *PLAN]) == 0
    out, err = capfd.readouterr()
    assert "uncalibrated" in out and "measuring this machine failed" in out
    assert str(failure) in out and "Traceback" not in err


def test_gpu_clusters_and_profile_files_do_not_touch_the_cache(
    cache, measured, tmp_path, spec_dir, capfd
) -> None:
    assert main(["plan", str(spec_dir / "multitask_clip.spindle"), "--quiet"]) == 0
    out, _ = capfd.readouterr()
    assert "uncalibrated" not in out
    spec = str(spec_dir / "tiny_mm.spindle")
    graph = compile_file(spec, cluster_overrides={"devices": 2}).graph
    needs = ProfileNeeds.of(graph)
    everything = CachedProfile.empty(MachineKey.here(2)).missing(needs)
    path = tmp_path / "p.json"
    fake_profile(graph, 2, everything).write(path)
    assert main(["plan", spec, *PLAN, "--profile", str(path)]) == 0
    out, err = capfd.readouterr()
    assert "uncalibrated" not in out and "cached profile" not in err
    assert measured == [] and not cache.exists()


# --- the file -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "{garbage",  # not JSON
        '{"format": "spindle-profile-cache", "version": 1, "machine": {"cpu": "x"',  # cut short
        '{"format": "spindle-profile", "version": 1}',  # a profile file, not a cache
        "OTHER",  # another machine's cache (filled in below)
    ],
)
def test_an_unusable_cache_file_is_ignored_with_a_warning_and_rebuilt(
    cache, measured, spec_dir, capfd, text
) -> None:
    path = the_cache_file(cache)
    path.parent.mkdir(parents=True)
    if text == "OTHER":
        other = CachedProfile.empty(replace(MachineKey.here(2), cpu="another"))
        text = json.dumps(other.to_dict())
    path.write_text(text)
    assert main(["plan", str(spec_dir / "tiny_mm.spindle"), *PLAN]) == 0
    out, err = capfd.readouterr()
    assert "warning: ignoring the profile cache" in err and "Traceback" not in err
    assert len(measured) == 1 and measured[0][1].machine  # measured afresh
    cached, warning = read_cache(path, MachineKey.here(2))
    assert warning is None and len(cached.profile.entries) == 12
    assert "uncalibrated" not in out


def test_cache_writes_are_atomic_while_others_write_and_read(tmp_path, spec_dir) -> None:
    """Writers replacing the file while a reader reads it: every read sees a whole file (one
    writer's or another's), and no temporary file is left behind."""
    graph = compile_file(str(spec_dir / "tiny_mm.spindle"), cluster_overrides={"devices": 2}).graph
    key = MachineKey.here(2)
    needs = ProfileNeeds.of(graph)
    full = CachedProfile.empty(key).missing(needs)
    versions = [
        CachedProfile.empty(key).merged(fake_profile(graph, 2, full), needs, full),
        CachedProfile.empty(key).merged(
            fake_profile(graph, 2, replace(full, shapes=frozenset())), needs, full
        ),
    ]
    path = tmp_path / key.file_name()
    write_cache(path, versions[0])
    stop = threading.Event()
    failures: list[str] = []

    def writer(which: int) -> None:
        while not stop.is_set():
            write_cache(path, versions[which])

    def reader() -> None:
        for _ in range(200):
            _, warning = read_cache(path, key)
            if warning:
                failures.append(warning)

    threads = [threading.Thread(target=writer, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    reader()
    stop.set()
    for t in threads:
        t.join()
    assert failures == []
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_the_cached_profile_prices_a_spec_in_its_own_names(spec_dir) -> None:
    """Terms filed under cache keys come back under the spec's names, and a module of the same
    name but another shape is not taken for the cached one."""
    spec = spec_dir / "tiny_mm.spindle"
    graph = compile_file(str(spec), cluster_overrides={"devices": 2}).graph
    needs = ProfileNeeds.of(graph)
    empty = CachedProfile.empty(MachineKey.here(2))
    everything = empty.missing(needs)
    cached = empty.merged(fake_profile(graph, 2, everything), needs, everything)
    assert cached.missing(needs).empty
    profile = cached.for_needs(needs, "cache.json")
    o = profile.overheads
    assert o is not None and o.source == "cache.json"
    assert {k for k, _ in o.inputs} == {n for n, _ in needs.inputs}
    assert {k for k, _ in o.parts} == {n for n, _ in needs.parts}
    assert {m for e in profile.entries for m in e.metaops} == {op.id for op in graph.metaops}
    text = spec.read_text().replace("heads = 4, causal", "heads = 8, causal")
    other = compile_file_text(text, devices=2)
    lacking = cached.missing(ProfileNeeds.of(other))
    assert "lm/layer" in lacking.parts and "lm/head" in lacking.parts
    assert "vision/layer" not in lacking.parts  # the same module as cached


def compile_file_text(text: str, devices: int) -> MetaGraph:
    from spindle_dsl.language import compile_text

    return compile_text(text, cluster_overrides={"devices": devices}).graph


# --- the real measurement -------------------------------------------------------------------

SMALL = """
cluster { devices = 2; device = "cpu" }
modality text { tokens = 8; vocab = 64 }
module  lm : transformer(layers = 1, hidden = 16, heads = 2, causal = true, vocab = 64)
task chat { text -> lm; loss = lm; batch = 4 }
"""


@pytest.mark.slow
def test_measuring_on_workers_fills_the_cache_and_then_only_what_is_new(
    cache, monkeypatch, tmp_path, capfd
) -> None:
    spec = tmp_path / "small.spindle"
    spec.write_text(SMALL)
    got: list[Profile] = []
    real = calibration.measure_on_workers

    def spy(graph: MetaGraph, ranks: int, selection: ProfileSelection) -> Profile:
        got.append(real(graph, ranks, selection))
        return got[-1]

    monkeypatch.setattr(calibration, "measure_on_workers", spy)
    assert main(["plan", str(spec), "--quiet", "--scheduler", "paper"]) == 0
    out, err = capfd.readouterr()
    assert "uncalibrated" not in out and "profile [" in err  # the progress bar
    assert len(got) == 1 and got[0].overheads and dict(got[0].overheads.all_reduce.fits)
    no_measuring(monkeypatch)
    assert main(["plan", str(spec), "--quiet", "--scheduler", "paper"]) == 0
    assert "cached profile" in capfd.readouterr().err
    monkeypatch.setattr(calibration, "measure_on_workers", spy)
    spec.write_text(SMALL.replace("batch = 4", "batch = 4 }\ntask more { text[6] -> lm; "
                                  "loss = lm; batch = 2"))  # fmt: skip
    assert main(["plan", str(spec), "--quiet", "--scheduler", "paper"]) == 0
    capfd.readouterr()
    assert len(got) == 2
    # only the new shape's layer, data and 2-way tensor parallel
    assert [(e.tokens, e.tp) for e in got[1].entries] == [(6, 1), (6, 2)]
    assert got[1].overheads and not got[1].overheads.all_reduce.fits  # no collectives again
