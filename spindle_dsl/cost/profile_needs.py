"""What a graph needs from a profile of CPU workers, named so that specs can share it.

A ``spindle profile --nproc N`` file answers for one spec: its input stages, loss heads and
optimizer parts are filed under the spec's own names (``lm/input.text@12:train``,
``lm/layer``). The profile cache answers for every spec run on the machine, so here each of
those terms gets a second name, its cache key: the spec's name and a fingerprint of the module
it belongs to (its kind, resolved arguments, frozenness and the modalities its input stages
read), so that two specs calling different modules ``lm`` never share a figure and a renamed
module is measured again. Layer shapes need no such name: ``shape_key`` already says all that
determines a layer's time (its tensor-parallel degree included: each degree the runtime can
split a shape into, up to the workers that compute side by side, is a shape of its own), and
the per-device batches the planner will ask about (``ShapeNeed.batches``) say which range of
the fit must be measured rather than extrapolated.

``ProfileSelection`` is the other direction: what a profiling run is to measure, in the spec's
own names (the backend measures a spec), for the terms the cache lacks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from spindle_dsl.cluster import usable_cores
from spindle_dsl.cost.overheads import part_class
from spindle_dsl.cost.profile import ShapeKey, shape_key
from spindle_dsl.cost.profiler import (
    measured_tp_degrees,
    needs_first_layer_ratio,
    shape_groups,
    tp_batches,
)
from spindle_dsl.cost.step_parts import op_steps, sink_losses
from spindle_dsl.metagraph import MetaGraph

POINTS = 5  # per-device batches per layer shape, as ``spindle profile`` times by default


@dataclass(frozen=True)
class ShapeNeed:
    """One layer shape of the graph and what its profile entry must cover."""

    key: ShapeKey
    metaops: tuple[str, ...]  # the graph's MetaOps of this shape
    batches: tuple[int, ...]  # per-device batches (rows per group) priced (``tp_batches``)
    first_layer_ratio: bool  # whether some MetaOp of it needs ``first_layer_ratio``


@dataclass(frozen=True)
class ProfileNeeds:
    """Every term a graph's step is priced with, each as ``(the spec's name, the cache's
    name)`` (see the module docstring); part classes (``part_class``) for the optimizer."""

    spec: str
    shapes: tuple[ShapeNeed, ...]
    inputs: tuple[tuple[str, str], ...]
    losses: tuple[tuple[str, str], ...]
    parts: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, graph: MetaGraph, points: int = POINTS) -> ProfileNeeds:
        devices = graph.cluster.devices
        side_by_side = min(devices, usable_cores())
        shapes = tuple(
            ShapeNeed(
                shape_key(ops[0], tp),
                tuple(o.id for o in ops),
                tp_batches(ops, devices, tp, points),
                tp == 1 and needs_first_layer_ratio(graph, ops),
            )
            for ops in shape_groups(graph)
            for tp in (1, *measured_tp_degrees(ops[0], graph.cluster, side_by_side))
        )
        inputs = {  # a MetaOp without samples runs no input stage (nor is one measured)
            stage.key: cache_key(graph, stage.key, stage.part.split("/")[0])
            for op in op_steps(graph).values()
            if op.batch > 0
            for stage in op.inputs
        }
        losses = {
            s.key: cache_key(graph, s.key, graph.op(s.sink).segments[-1][0])
            for s in sink_losses(graph)
        }
        parts = {cls_: cache_key(graph, cls_, cls_.split("/")[0]) for cls_ in part_classes(graph)}
        return cls(graph.spec_path, shapes, *(tuple(d.items()) for d in (inputs, losses, parts)))

    def merged(self, other: ProfileNeeds) -> ProfileNeeds:
        """The needs of both graphs (the phases of a schedule): a shape both have must cover
        both's batches."""
        shapes: dict[ShapeKey, ShapeNeed] = {s.key: s for s in self.shapes}
        for s in other.shapes:
            had = shapes.get(s.key)
            shapes[s.key] = s if had is None else ShapeNeed(
                s.key,
                _union(had.metaops, s.metaops),
                tuple(sorted(set(had.batches) | set(s.batches))),
                had.first_layer_ratio or s.first_layer_ratio,
            )  # fmt: skip
        return ProfileNeeds(
            self.spec,
            tuple(shapes.values()),
            _union(self.inputs, other.inputs),
            _union(self.losses, other.losses),
            _union(self.parts, other.parts),
        )


@dataclass(frozen=True)
class ProfileSelection:
    """What a profiling run measures, in the spec's names: the layer shapes, input stages,
    loss heads and part classes listed, and with ``machine`` the terms every spec shares
    (the collectives, the exchange, the flat-buffer copies, a stage's fixed cost and, with
    more ranks than cores, the cost of taking turns). AdamW's line per byte is measured
    whenever parts are (their figures are read beside it)."""

    shapes: frozenset[ShapeKey] = frozenset()
    inputs: frozenset[str] = frozenset()
    losses: frozenset[str] = frozenset()
    parts: frozenset[str] = frozenset()
    machine: bool = False

    @property
    def empty(self) -> bool:
        return not (self.shapes or self.inputs or self.losses or self.parts or self.machine)

    def describe(self) -> str:
        """``2 layer shapes, 2 tensor-parallel layouts, 1 input stage and the machine's
        collectives``, for a progress line."""
        split = sum(1 for key in self.shapes if key[-1] > 1)
        counts = (
            (len(self.shapes) - split, "layer shape"),
            (split, "tensor-parallel layout"),
            (len(self.inputs), "input stage"),
            (len(self.losses), "loss head"),
            (len(self.parts), "optimizer part"),
        )
        items = [f"{n} {what}{'s' if n != 1 else ''}" for n, what in counts if n]
        if self.machine:
            items.append("the collectives and fixed costs")
        if len(items) > 1:
            return ", ".join(items[:-1]) + " and " + items[-1]
        return items[0] if items else "nothing"


def part_classes(graph: MetaGraph) -> dict[str, str]:
    """A trainable part of every class the optimizer steps (``part_class``), by class, in the
    order the step meets them: the part a profile times for the class."""
    out: dict[str, str] = {}
    for op in op_steps(graph).values():
        keys = [k for k, b in op.layer_parts if b > 0] + [s.part for s in op.inputs if s.grad_bytes]
        for key in keys:
            out.setdefault(part_class(key), key)
    for s in sink_losses(graph):
        if s.head_part and s.head_bytes:
            out.setdefault(part_class(s.head_part), s.head_part)
    return out


def module_fingerprint(graph: MetaGraph, module: str) -> str:
    """A short digest of what a module's input stages, head and optimizer parts cost by: its
    kind, resolved arguments, frozenness and the modalities its input stages read (as they see
    them, ``MetaGraph.stage_modality``). Empty where the graph does not declare the module."""
    info = next((m for m in graph.modules if m.name == module), None)
    if info is None:
        return ""
    stages = [asdict(graph.stage_modality(module, name)) for name, _ in info.raw_inputs]
    what = [info.kind, [list(a) for a in info.args], info.frozen, stages]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]


def cache_key(graph: MetaGraph, name: str, module: str) -> str:
    """The cache's name of the term the spec calls ``name``, which belongs to ``module``."""
    return f"{name}#{module_fingerprint(graph, module)}"


def _union(a: Iterable, b: Iterable) -> tuple:
    """The items of ``a`` then those of ``b`` not in it, in order."""
    out = dict.fromkeys(a)
    out.update(dict.fromkeys(b))
    return tuple(out)
