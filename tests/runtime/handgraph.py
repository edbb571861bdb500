"""Small MetaGraphs and plans built by hand, for runtime tests that must not wait on (or break
with) the language front end and the planner.

``lower`` follows the lowering rules of docs/contracts.md for the simple specs these tests
need (no contraction of chains): a task is a list of edges; MetaOp tokens are the sum over
incoming edges; widths, out_tokens and parameter counts come from the kinds registry.
"""

from __future__ import annotations

from collections.abc import Sequence

from spindle_dsl.cluster import PRESETS, Cluster
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph, MetaOp, ModalityInfo, ModuleInfo, OpInput, TaskInfo
from spindle_dsl.plan.model import ClusterRef, Entry, Plan, PlanMetaOp, SolverInfo, SpecRef, Wave

# name -> (kind, args, frozen)
Modules = dict[str, tuple[str, dict, bool]]
# name -> (edges [(src, dst, tokens or None)], batch, loss)
Tasks = dict[str, tuple[Sequence[tuple[str, str, int | None]], int, str]]


def lower(
    modules: Modules, modalities: Sequence[ModalityInfo], tasks: Tasks, devices: int = 4
) -> MetaGraph:
    mods = {m.name: m for m in modalities}
    resolved = {n: (k, get_kind(k).resolve(a), f) for n, (k, a, f) in modules.items()}
    metaops: dict[str, MetaOp] = {}
    task_infos = []
    for task, (edges, batch, loss) in tasks.items():
        order = []
        for s, d, _ in edges:
            for x in (s, d):
                if x in modules and x not in order:
                    order.append(x)
        incoming = {m: [e for e in edges if e[1] == m] for m in order}
        built: dict[str, MetaOp] = {}
        pending = list(order)
        while pending:
            for m in pending:
                srcs = [s for s, _, _ in incoming[m] if s in modules]
                if all(f"{task}/{s}" in built for s in srcs):
                    break
            pending.remove(m)
            kind_name, args, frozen = resolved[m]
            kind = get_kind(kind_name)
            inputs = []
            for s, _, tok in incoming[m]:
                if s in modules:
                    inputs.append(OpInput(f"{task}/{s}", False, built[f"{task}/{s}"].out_tokens))
                else:
                    inputs.append(OpInput(s, True, tok or mods[s].tokens))
            tokens = sum(i.tokens for i in inputs)
            deps = [built[i.source] for i in inputs if not i.from_modality]
            level = max((d.level + 1 for d in deps), default=0)
            needs = (not frozen) or any(d.needs_backward for d in deps)
            op = MetaOp(
                id=f"{task}/{m}",
                task=task,
                module=m,
                segments=((m, int(args["layers"])),),
                kind=kind_name,
                args=tuple(sorted(args.items())),
                layers=int(args["layers"]),
                batch=batch,
                tokens=tokens,
                out_tokens=kind.out_tokens(args, tokens),
                in_width=kind.in_width(args),
                out_width=kind.out_width(args),
                inputs=tuple(inputs),
                level=level,
                frozen=frozen,
                needs_backward=needs,
                forward_flops_per_layer=kind.forward_flops(args, tokens) * batch,
                params_per_layer=kind.layer_params(args),
                param_bytes_per_layer=kind.layer_params(args) * 4,
            )
            built[op.id] = op
        metaops.update(built)
        consumed = {i.source for op in built.values() for i in op.inputs}
        sinks = tuple(o for o in built if o not in consumed)
        task_infos.append(TaskInfo(task, batch, None, loss, sinks))
    ops = sorted(metaops.values(), key=lambda o: (o.level, list(metaops).index(o.id)))
    infos = tuple(
        ModuleInfo(
            n,
            k,
            tuple(sorted(a.items())),
            f,
            None,
            tuple(t for t in tasks if f"{t}/{n}" in metaops),
            0,
        )
        for n, (k, a, f) in resolved.items()
    )
    return MetaGraph(
        metaops=tuple(ops),
        tasks=tuple(task_infos),
        modules=infos,
        modalities=tuple(modalities),
        cluster=Cluster(devices=devices, devices_per_node=devices, device=PRESETS["cpu"]),
        mix=None,
        dtype_bytes=4,
        spec_path="<hand>",
        spec_sha256="",
    )


def tiny_mm(devices: int = 4) -> MetaGraph:
    """tiny_mm.spindle, lowered by hand."""
    return lower(
        {
            "vision": ("vit", dict(layers=4, hidden=64, heads=4, patch=4), False),
            "hearing": ("transformer", dict(layers=2, hidden=48, heads=4), False),
            "vision_proj": ("mlp", {"in": 64, "out": 96}, False),
            "audio_proj": ("mlp", {"in": 48, "out": 96}, False),
            "lm": (
                "transformer",
                dict(layers=6, hidden=96, heads=4, causal=True, vocab=512),
                False,
            ),
        },
        [
            ModalityInfo("image", 16),
            ModalityInfo("audio", 24, features=20),
            ModalityInfo("text", 12, vocab=512),
        ],
        {
            "caption": (
                [
                    ("image", "vision", None),
                    ("vision", "vision_proj", None),
                    ("vision_proj", "lm", None),
                    ("text", "lm", None),
                ],
                24,
                "lm",
            ),
            "transcribe": (
                [
                    ("audio", "hearing", None),
                    ("hearing", "audio_proj", None),
                    ("audio_proj", "lm", None),
                    ("text", "lm", 8),
                ],
                8,
                "lm",
            ),
        },
        devices,
    )


def make_plan(graph: MetaGraph, waves: Sequence[Sequence[tuple[str, int, int, tuple]]]) -> Plan:
    """A plan with the given waves of (metaop, first, end, devices); times are nominal."""
    n = graph.cluster.devices
    metaops = tuple(
        PlanMetaOp.of(m, tuple((k, 1e-3 / k) for k in range(1, n + 1)))
        for m in graph.metaops
        if m.batch > 0
    )
    out, start = [], 0.0
    for i, entries in enumerate(waves):
        es = tuple(Entry(mid, a, b, tuple(d), (b - a) * 1e-3 / len(d)) for mid, a, b, d in entries)
        dur = max(e.time_s for e in es)
        out.append(Wave(i, start, dur, es))
        start += dur
    return Plan(
        SpecRef(graph.spec_path, graph.spec_sha256, graph.mix),
        ClusterRef(n, "cpu", n, 4 * 2**30),
        metaops,
        tuple(out),
        start,
        start / 2,
        (("sequential_s", start),),
        SolverInfo("hand", "heuristic", 0.0),
    )


def sequential_plan(graph: MetaGraph) -> Plan:
    """Every MetaOp in turn on all devices."""
    devs = tuple(range(graph.cluster.devices))
    return make_plan(graph, [[(m.id, 0, m.layers, devs)] for m in graph.metaops if m.batch > 0])


def clip_like(devices: int = 4) -> MetaGraph:
    """Contrastive and mse tasks, a frozen encoder, a shared text encoder, a resampler, a task
    whose batch (3) is smaller than some device groups (empty shards), and a MetaOp (fuse) with
    two upstream inputs, one of which (imu_enc) also feeds another consumer."""
    return lower(
        {
            "img_enc": ("vit", dict(layers=2, hidden=32, heads=2, patch=2), True),
            "img_head": ("mlp", {"in": 32, "out": 24}, False),
            "imu_enc": ("transformer", dict(layers=2, hidden=16, heads=2), False),
            "imu_head": ("mlp", {"in": 16, "out": 24, "hidden": 20}, False),
            "text_enc": ("transformer", dict(layers=3, hidden=24, heads=2, vocab=64), False),
            "res": ("resampler", {"in": 16, "hidden": 16, "heads": 2, "out_tokens": 4}, False),
            "fuse": ("mlp", {"in": 16, "out": 16}, False),
        },
        [
            ModalityInfo("image", 8),
            ModalityInfo("imu", 6, features=12),
            ModalityInfo("text", 10, vocab=64),
        ],
        {
            "image_text": (
                [
                    ("image", "img_enc", None),
                    ("img_enc", "img_head", None),
                    ("text", "text_enc", None),
                ],
                6,
                "contrastive",
            ),
            "imu_text": (
                [("imu", "imu_enc", None), ("imu_enc", "imu_head", None), ("text", "text_enc", 7)],
                3,
                "contrastive",
            ),
            "regress": (
                [
                    ("imu", "imu_enc", None),
                    ("imu_enc", "res", None),
                    ("imu_enc", "fuse", None),
                    ("res", "fuse", None),
                ],
                5,
                "mse",
            ),
        },
        devices,
    )


CLIP_WAVES = (
    (
        ("image_text/img_enc", 0, 2, (0, 1)),
        ("imu_text/imu_enc", 0, 1, (2,)),
        ("regress/imu_enc", 0, 2, (3,)),
    ),
    (("imu_text/imu_enc", 1, 2, (0, 1, 2, 3)),),
    (("image_text/text_enc", 0, 3, (1, 2, 3)), ("imu_text/imu_head", 0, 1, (0,))),
    (
        ("imu_text/text_enc", 0, 2, (0, 1)),
        ("image_text/img_head", 0, 1, (2,)),
        ("regress/res", 0, 1, (3,)),
    ),
    (("imu_text/text_enc", 2, 3, (2, 3)), ("regress/fuse", 0, 1, (1, 0))),
)

TINY_WAVES = (
    (("caption/vision", 0, 2, (0, 1, 2)), ("transcribe/hearing", 0, 2, (3,))),
    (("caption/vision", 2, 4, (0, 1)), ("transcribe/audio_proj", 0, 1, (2, 3))),
    (("caption/vision_proj", 0, 1, (3,)), ("transcribe/lm", 0, 3, (0, 1, 2))),
    (("caption/lm", 0, 4, (0, 1, 2, 3)),),
    (("caption/lm", 4, 6, (1, 3)), ("transcribe/lm", 3, 6, (0, 2))),
)
