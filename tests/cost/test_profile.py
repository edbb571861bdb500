"""The profile file, the profiled cost model and the profiler on real (tiny) layers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.fit import PiecewiseFit, Segment
from spindle_dsl.cost.profile import Profile, ProfiledCostModel, ProfileEntry, Sample, shape_key
from spindle_dsl.cost.profiler import (
    TimingBudget,
    layer_runner,
    planned_batches,
    profile_graph,
    time_interleaved,
    time_layer,
)
from spindle_dsl.errors import SpindleError
from spindle_dsl.metagraph import MetaGraph

MLP = {"in": 16, "out": 16, "hidden": 32}


def graph(cluster, *ops) -> MetaGraph:
    return MetaGraph(tuple(ops), (), (), (), cluster, None, 4)


def synthetic_profile(op, alpha: float, beta: float) -> Profile:
    kind, args, tokens, mode, _ = shape_key(op)
    entry = ProfileEntry(
        kind=kind,
        args=args,
        tokens=tokens,
        mode=mode,  # type: ignore[arg-type]
        metaops=(op.id,),
        samples=(Sample(1, 1.0, alpha + beta),),
        fit=PiecewiseFit((Segment(0.0, float("inf"), alpha, beta),)),
    )
    return Profile("cpu", "cpu", "x", 1, "float32", "s.spindle", (entry,))


def test_planned_batches_span_the_needed_range() -> None:
    assert planned_batches(24, 4) == (6, 8, 12, 24)
    many = planned_batches(1000, 64, points=5)
    assert len(many) == 5 and many[0] == 16 and many[-1] == 1000


def test_profiled_curve_is_the_fit_at_the_largest_shard(build_op, cluster) -> None:
    c = cluster(4, "cpu")
    op = build_op("mlp", MLP, batch=10, tokens=8, dtype_bytes=4)
    model = ProfiledCostModel(c, synthetic_profile(op, 1e-3, 1e-9))
    curve = model.curves(graph(c, op))[op.id]
    per_sample = 3 * op.forward_flops_per_layer / 10
    assert curve.at(1) == pytest.approx(1e-3 + 1e-9 * per_sample * 10)
    # Three devices: the largest shard has 4 samples; the gradient reduction is not in the
    # curve (the step model prices it once per step, as the runtime issues it).
    assert curve.at(3) == pytest.approx(1e-3 + 1e-9 * per_sample * 4)
    assert model.step_model(graph(c, op)).grad_in_curves is False
    assert list(curve.seconds) == sorted(curve.seconds, reverse=True)


def test_a_fit_never_falls_as_the_work_grows() -> None:
    # noisy timings: the second segment starts below where the first ends
    fit = PiecewiseFit((Segment(0.0, 10.0, 1.0, 0.5), Segment(10.0, float("inf"), 2.0, 0.1)))
    xs = [0.0, 5.0, 9.9, 10.0, 20.0, 30.0, 60.0, 100.0]
    values = [fit.predict(x) for x in xs]
    assert values == sorted(values)
    assert fit.predict(20.0) == pytest.approx(6.0)  # held at the first segment's end
    assert fit.predict(100.0) == pytest.approx(12.0)  # the second segment, once above it


def test_memory_is_priced_at_the_shard_the_runtime_runs(build_op, cluster) -> None:
    """A flat profile (as noise can make a small layer's) must not make the model think one
    replica runs the whole batch: the runtime splits it over every device of the entry."""
    c = cluster(4, "cpu")
    op = build_op("mlp", MLP, batch=12, tokens=8, dtype_bytes=4)
    flat = ProfiledCostModel(c, synthetic_profile(op, 1e-3, 0.0))  # no slope: ties
    sloped = ProfiledCostModel(c, synthetic_profile(op, 1e-3, 1e-9))
    for n in (1, 2, 3, 4):  # memory depends on the shard, never on the timings
        assert flat.memory_bytes(op, n, 1) == sloped.memory_bytes(op, n, 1)


def test_profile_round_trips_through_json(tmp_path, build_op, cluster) -> None:
    op = build_op("mlp", MLP, batch=10, tokens=8, dtype_bytes=4)
    profile = synthetic_profile(op, 2e-3, 3e-9)
    path = tmp_path / "p.json"
    profile.write(path)
    assert Profile.read(path) == profile
    model = make_cost_model(cluster(2, "cpu"), path)
    assert isinstance(model, ProfiledCostModel)
    assert model.curves(graph(cluster(2, "cpu"), op)).source == str(path)


def with_tp_entry(profile: Profile, tp: int, alpha: float, beta: float) -> Profile:
    """``profile`` with its one layer shape also timed ``tp``-way tensor parallel."""
    entry = replace(
        profile.entries[0], tp=tp, fit=PiecewiseFit((Segment(0.0, float("inf"), alpha, beta),))
    )
    return replace(profile, entries=(*profile.entries, entry))


def test_a_measured_tensor_parallel_layout_is_priced_from_its_entry(build_op, cluster) -> None:
    """A layout the profile timed is priced from its own fit (no estimate added), chosen where
    it is faster than data parallelism, never where it is slower, and off under ``--tp 1``."""
    c = cluster(4, "cpu")
    op = build_op("mlp", MLP, batch=2, tokens=8, dtype_bytes=4)
    per_sample = 3 * op.forward_flops_per_layer / 2
    base = synthetic_profile(op, 1e-3, 1e-9)
    fast = with_tp_entry(base, 2, 1e-4, 1e-9)
    curve = ProfiledCostModel(c, fast).curves(graph(c, op))[op.id]
    # a batch of 2 stops data parallelism at 2 devices; two 2-way groups use 4
    assert curve.layout(4) == (2, 2)
    assert curve.at(4) == pytest.approx(1e-4 + 1e-9 * per_sample * 1 / 2)
    slow = with_tp_entry(base, 2, 1e-2, 1e-9)
    assert ProfiledCostModel(c, slow).curves(graph(c, op))[op.id].layouts == ()
    assert ProfiledCostModel(c, fast, tp=1).curves(graph(c, op))[op.id].layouts == ()
    # forced, the measured figure replaces the estimate
    forced = ProfiledCostModel(c, slow, tp=2).curves(graph(c, op))[op.id]
    assert forced.layout(2) == (1, 2)
    assert forced.at(2) == pytest.approx(1e-2 + 1e-9 * per_sample * 2 / 2)


def test_a_tensor_parallel_entry_round_trips_and_a_bad_degree_is_refused(
    tmp_path, build_op
) -> None:
    op = build_op("mlp", MLP, batch=10, tokens=8, dtype_bytes=4)
    profile = with_tp_entry(synthetic_profile(op, 2e-3, 3e-9), 2, 1e-3, 2e-9)
    path = tmp_path / "p.json"
    profile.write(path)
    assert Profile.read(path) == profile
    assert profile.lookup(op, 2) is profile.entries[1] and profile.lookup(op, 4) is None
    data = json.loads(path.read_text())
    assert "tp" not in data["entries"][0] and data["entries"][1]["tp"] == 2
    data["entries"][1]["tp"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(SpindleError, match="tp 0 is not a degree"):
        Profile.read(path)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "invalid JSON"),
        ('{"format": "spindle-plan", "version": 1}', "not a spindle profile"),
        ('{"format": "spindle-profile", "version": 1, "device": "cpu"}', "malformed"),
    ],
)
def test_bad_profile_files_give_clear_errors(tmp_path, cluster, text, words) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(SpindleError, match=words):
        make_cost_model(cluster(2, "cpu"), path)
    with pytest.raises(SpindleError, match="cannot read profile"):
        make_cost_model(cluster(2, "cpu"), tmp_path / "missing.json")


def test_profile_without_a_metaop_says_which(build_op, cluster) -> None:
    op = build_op("mlp", MLP, batch=10, tokens=8, dtype_bytes=4)
    other = build_op("mlp", MLP, batch=10, tokens=9, dtype_bytes=4, op_id="t/other")
    model = ProfiledCostModel(cluster(2, "cpu"), synthetic_profile(op, 1e-3, 0.0))
    with pytest.raises(SpindleError, match="t/other"):
        model.curves(graph(cluster(2, "cpu"), op, other))


QUICK = TimingBudget(warmup=1, min_repeats=3, max_repeats=5, min_seconds=0.0)


@pytest.mark.parametrize("mode", ["train", "input_grad", "forward"])
def test_time_layer_runs_each_mode(mode) -> None:
    assert time_layer(layer_runner("mlp", dict(MLP), 8, mode, 4), QUICK) > 0


# A layer large enough that its matmuls, not Python's overhead, take the time: 0.27 GFLOP
# forward at batch 4 (some milliseconds on one CPU core), 4x that at batch 16.
WIDE = {"in": 256, "out": 256, "hidden": 1024}
TOKENS = 64
# medians of repeats timed in interleaved turns: a burst of other work on the machine lands in
# a few repeats of every point alike, not in one point's whole measurement
STEADY = TimingBudget(warmup=2, min_repeats=9, max_repeats=9, min_seconds=0.0)


@pytest.fixture
def one_thread():
    """One torch thread, as the profiling workers run: on a busy 2-core machine a second
    thread waits for a core and turns a matmul's time into the scheduler's."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def timed(modes_and_batches: list[tuple[str, int]], holds, attempts: int = 3) -> list[float]:
    """The WIDE layer timed at each (mode, batch), interleaved, until ``holds(times)``, at most
    ``attempts`` times: a machine busy enough to blur one measurement rarely blurs three in a
    row, while a profiler that times the wrong thing fails every one. Returns the last times."""
    for _ in range(attempts):
        steps = [layer_runner("mlp", dict(WIDE), TOKENS, m, b) for m, b in modes_and_batches]
        times = time_interleaved(steps, STEADY, rounds=3)
        if holds(times):
            break
    return times


@pytest.mark.parametrize("mode", ["train", "input_grad", "forward"])
def test_time_layer_grows_with_the_work(mode, one_thread) -> None:
    """4x the batch is 4x the FLOPs: the measured time must grow well past noise (more than
    1.5x; it measures 3-5x), or the profile's slopes, and so the planner's curves, are noise."""

    def holds(t: list[float]) -> bool:
        return t[1] > 1.5 * t[0]

    times = timed([(mode, 4), (mode, 16)], holds)
    assert times[0] > 0 and holds(times), (mode, times)


def test_each_mode_times_the_work_it_does(one_thread) -> None:
    """At one shape, forward alone < forward with the input's gradient (about 2x the forward's
    FLOPs) < a full training step (about 3x, the weights' gradients too)."""

    def holds(t: list[float]) -> bool:
        forward, input_grad, train = t
        return input_grad > 1.2 * forward and train > input_grad and train > 1.5 * forward

    times = timed([("forward", 8), ("input_grad", 8), ("train", 8)], holds)
    assert holds(times), dict(zip(("forward", "input_grad", "train"), times, strict=True))


FROZEN_TOWER_SPEC = """
cluster { devices = 2; device = "cpu" }
modality image { tokens = 16 }
modality text  { tokens = 8; vocab = 32 }
encoder vision : vit(layers = 2, hidden = 16, heads = 2, patch = 4) <- image frozen
module  adapt  : mlp(in = 16, out = 16, hidden = 32, layers = 2)
module  lm     : transformer(layers = 2, hidden = 16, heads = 2, causal = true, vocab = 32)
task caption { image -> vision -> adapt -> lm; text -> lm; loss = lm; batch = 4 }
"""


def test_a_trained_op_after_frozen_towers_saves_what_its_first_layer_was_measured_to() -> None:
    from spindle_dsl.cost.profile import first_input_needs_no_gradient, first_layer_saving
    from spindle_dsl.language import compile_text

    graph = compile_text(FROZEN_TOWER_SPEC).graph
    needs = {op.id: first_input_needs_no_gradient(graph, op) for op in graph.metaops}
    assert needs == {"caption/vision": False, "caption/adapt": True, "caption/lm": False}
    adapt, lm = graph.op("caption/adapt"), graph.op("caption/lm")
    # 2 layers, the first at the measured 0.8 of a layer: (1 + 0.8) / 2
    assert first_layer_saving(graph, adapt, 0.8) == pytest.approx(0.9)
    assert first_layer_saving(graph, adapt, None) == 1.0  # not measured: no saving claimed
    assert first_layer_saving(graph, lm, 0.8) == 1.0  # its input (the adapter's) trains


def test_the_profiler_measures_the_first_layer_of_an_op_after_frozen_towers(tmp_path) -> None:
    from spindle_dsl.language import compile_text

    graph = compile_text(FROZEN_TOWER_SPEC).graph
    lines: list[str] = []
    profile = profile_graph(graph, points=2, budget=QUICK, progress=lines.append)
    ratios = {e.metaops: e.first_layer_ratio for e in profile.entries}
    assert ratios[("caption/vision",)] is None and ratios[("caption/lm",)] is None
    ratio = ratios[("caption/adapt",)]
    assert ratio is not None and 0.0 < ratio <= 1.0
    assert any("input needs no gradient" in line for line in lines)
    path = tmp_path / "p.json"
    profile.write(path)
    assert Profile.read(path) == profile  # the ratio survives the file
    # the adapter's curve is the timed layer's, scaled by (1 + ratio) / 2; an older profile
    # without the measurement prices the timed layer as it is
    plain = tmp_path / "plain.json"
    data = json.loads(path.read_text())
    for entry in data["entries"]:
        entry.pop("first_layer_ratio", None)
    plain.write_text(json.dumps(data))
    c = graph.cluster
    with_ratio = make_cost_model(c, path).curves(graph)["caption/adapt"]
    without = make_cost_model(c, plain).curves(graph)["caption/adapt"]
    for n, t in without.items():
        assert with_ratio.at(n) == pytest.approx(t * (1 + ratio) / 2)


def test_a_profile_with_a_first_layer_ratio_outside_0_1_is_refused(tmp_path) -> None:
    from spindle_dsl.language import compile_text

    graph = compile_text(FROZEN_TOWER_SPEC).graph
    path = tmp_path / "p.json"
    profile_graph(graph, points=2, budget=QUICK).write(path)
    data = json.loads(path.read_text())
    next(e for e in data["entries"] if "first_layer_ratio" in e)["first_layer_ratio"] = 1.5
    path.write_text(json.dumps(data))
    with pytest.raises(SpindleError, match=r"malformed profile.*first_layer_ratio"):
        make_cost_model(graph.cluster, path)


def test_interleaved_points_keep_their_ratio_on_a_drifting_machine() -> None:
    # A machine that runs at full speed for 15 calls, then at half speed: two points timed in
    # turns are slowed nearly alike (exact ratio 3); timed one after the other, the second
    # point's burst falls mostly in the slow part.
    calls = [0]

    def point(cost: float):
        def step() -> float:
            calls[0] += 1
            return cost * (1.0 if calls[0] <= 15 else 2.0)

        return step

    budget = TimingBudget(1, 10, 10, 0.0, statistic="mean")  # as the workers time
    a, b = time_interleaved([point(1.0), point(3.0)], budget, rounds=5)
    assert b / a == pytest.approx(3.0, rel=0.15)
    calls[0] = 0
    first, second = (time_layer_like(point(c), budget) for c in (1.0, 3.0))
    assert second / first > 3.0 * 1.5


def time_layer_like(step, budget: TimingBudget) -> float:
    """``time_layer``'s burst: warm-up, then every repeat back to back."""
    for _ in range(budget.warmup):
        step()
    return budget.summary([step() for _ in range(budget.max_repeats)])
