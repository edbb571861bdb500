"""Hand-built MetaGraph and Plan for the render tests, and the dot/chromium skip hooks.

The values are built by hand (not by the language or the planner) so these tests pin what the
renderers draw for a known input and keep passing whatever the upstream stages do.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from spindle_dsl.cluster import PRESETS, Cluster
from spindle_dsl.metagraph import MetaGraph, MetaOp, ModalityInfo, ModuleInfo, OpInput, TaskInfo
from spindle_dsl.plan.model import (
    ClusterRef,
    Entry,
    Plan,
    PlanMetaOp,
    SolverInfo,
    SpecRef,
    Wave,
)

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def chromium_path() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def pytest_collection_modifyitems(config, items):
    no_dot = shutil.which("dot") is None
    no_chrome = chromium_path() is None
    for item in items:
        if no_dot and "needs_dot" in item.keywords:
            item.add_marker(
                pytest.mark.skip(reason="Graphviz dot not installed (make system-deps)")
            )
        if no_chrome and "needs_chromium" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="no headless Chromium (make system-deps)"))


# (task, module, kind, layers, batch, tokens, deps, frozen, modality inputs, flops/layer)
OPS = (
    ("caption", "vision", "vit", 4, 24, 16, (), True, (("image", 16),), 2.0e9),
    ("transcribe", "hearing", "transformer", 2, 8, 24, (), False, (("audio", 24),), 1.0e9),
    ("caption", "vision_proj", "mlp", 1, 24, 16, ("caption/vision",), False, (), 1.0e8),
    ("transcribe", "audio_proj", "mlp", 1, 8, 24, ("transcribe/hearing",), False, (), 5.0e7),
    ("caption", "lm", "transformer", 6, 24, 28, ("caption/vision_proj",), False,
     (("text", 12),), 4.0e9),
    ("transcribe", "lm", "transformer", 6, 8, 32, ("transcribe/audio_proj",), False,
     (("text", 8),), 2.0e9),
)  # fmt: skip
LEVEL = {"vision": 0, "hearing": 0, "vision_proj": 1, "audio_proj": 1, "lm": 2}


def make_graph() -> MetaGraph:
    cluster = Cluster(devices=4, devices_per_node=2, device=PRESETS["cpu"])
    metaops = []
    for task, module, kind, layers, batch, tokens, deps, frozen, mods, flops in OPS:
        inputs = tuple(OpInput(d, False, tokens) for d in deps) + tuple(
            OpInput(m, True, t) for m, t in mods
        )
        metaops.append(
            MetaOp(
                id=f"{task}/{module}",
                task=task,
                module=module,
                segments=((module, layers),),
                kind=kind,
                args=(("layers", layers),),
                layers=layers,
                batch=batch,
                tokens=tokens,
                out_tokens=tokens,
                in_width=64,
                out_width=64,
                inputs=inputs,
                level=LEVEL[module],
                frozen=frozen,
                needs_backward=not frozen,
                forward_flops_per_layer=flops,
                params_per_layer=1000,
                param_bytes_per_layer=4000,
            )
        )
    modules = tuple(
        ModuleInfo(
            name,
            kind,
            (("layers", layers),),
            name == "vision",
            None,
            tuple(t for t, m, *_ in OPS if m == name),
            layers * 1000,
        )
        for name, kind, layers in (
            ("vision", "vit", 4),
            ("hearing", "transformer", 2),
            ("vision_proj", "mlp", 1),
            ("audio_proj", "mlp", 1),
            ("lm", "transformer", 6),
        )
    )
    return MetaGraph(
        metaops=tuple(sorted(metaops, key=lambda m: m.level)),
        tasks=(
            TaskInfo("caption", 24, 3.0, "lm", ("caption/lm",)),
            TaskInfo("transcribe", 8, 1.0, "lm", ("transcribe/lm",)),
        ),
        modules=modules,
        modalities=(
            ModalityInfo("image", 16),
            ModalityInfo("audio", 24, features=20),
            ModalityInfo("text", 12, vocab=512),
        ),
        cluster=cluster,
        mix="default",
        dtype_bytes=4,
        spec_path="hand/tiny.spindle",
        spec_sha256="0" * 64,
    )


# seconds per layer on n = 1, 2, 4 devices
CURVES = {
    "caption/vision": (0.04, 0.022, 0.012),
    "transcribe/hearing": (0.03, 0.016, 0.009),
    "caption/vision_proj": (0.01, 0.006, 0.004),
    "transcribe/audio_proj": (0.008, 0.005, 0.003),
    "caption/lm": (0.06, 0.032, 0.017),
    "transcribe/lm": (0.02, 0.011, 0.006),
}
# (wave) -> entries (metaop, first, end, devices)
WAVES = (
    (("caption/vision", 0, 4, (0, 1)), ("transcribe/hearing", 0, 2, (2, 3))),
    (("caption/vision_proj", 0, 1, (0,)), ("transcribe/audio_proj", 0, 1, (2,))),
    (("caption/lm", 0, 3, (0, 1, 2, 3)),),
    (("caption/lm", 3, 6, (0, 1)), ("transcribe/lm", 0, 6, (2, 3))),
)


def make_plan(graph: MetaGraph | None = None) -> Plan:
    graph = graph or make_graph()
    metaops = tuple(
        PlanMetaOp.of(m, tuple(zip((1, 2, 4), CURVES[m.id], strict=True))) for m in graph.metaops
    )
    curve = {m.id: dict(m.seconds_per_layer) for m in metaops}
    waves, start = [], 0.0
    for k, entries in enumerate(WAVES):
        es = tuple(
            Entry(mid, a, b, devs, (b - a) * curve[mid][len(devs)]) for mid, a, b, devs in entries
        )
        dur = max(e.time_s for e in es)
        waves.append(Wave(k, start, dur, es))
        start += dur
    seq = sum(m.layers * curve[m.id][4] for m in metaops)
    return Plan(
        spec=SpecRef("hand/tiny.spindle", "0" * 64, "default"),
        cluster=ClusterRef(4, "cpu", 2, 4 * 2**30),
        metaops=metaops,
        waves=tuple(waves),
        iteration_s=start,
        lower_bound_s=start * 0.8,
        baselines=(("sequential_s", seq), ("data_parallel_s", seq * 1.1)),
        solver=SolverInfo("hand", "heuristic", 0.0),
        memory_bytes=(2**30, 3 * 2**29, 2**29, 2**28),
    )


@pytest.fixture
def graph() -> MetaGraph:
    return make_graph()


@pytest.fixture
def plan() -> Plan:
    return make_plan()


@pytest.fixture
def chromium_exe() -> str:
    exe = chromium_path()
    if exe is None:
        pytest.skip("no headless Chromium (make system-deps)")
    return exe


@pytest.fixture
def no_dot(monkeypatch):
    """Make the project believe ``dot`` is not installed."""
    monkeypatch.setenv("SPINDLE_DOT", "")
