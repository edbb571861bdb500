"""Parameter parts: the unit of building, ownership, reduction and checkpointing.

A module's parameters split into parts: each of its layers (``layer.J``), one input stage per
raw modality it reads (``input.MODALITY``), and its LM head (``head``). A part is the smallest
piece a plan can place on a device group (an entry covers whole layers), so a rank builds only
the parts of the entries it runs, each part is reduced over exactly the ranks that hold it, and
a checkpoint stores one file per part inside a folder per module, which any other plan or
world size can read back. Plain Python, no torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph, MetaOp


@dataclass(frozen=True, order=True)
class Part:
    """One independently initialised group of parameters of ``module``."""

    module: str
    role: str  # "layer.J", "input.MODALITY" or "head"

    @property
    def key(self) -> str:
        return f"{self.module}/{self.role}"

    @classmethod
    def from_key(cls, key: str) -> Part:
        module, _, role = key.partition("/")
        return cls(module, role)


def part_seed(seed: int, part: Part) -> int:
    """A 63-bit seed from (run seed, module, part): the same tensors whoever builds the part,
    whatever else that process builds and in whatever order."""
    digest = hashlib.sha256(f"{seed}|{part.module}|{part.role}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def tied_stage(graph: MetaGraph, module: str) -> Part | None:
    """The input stage whose token embedding ``module``'s LM head multiplies by, when the
    module ties them (the checker makes sure it reads exactly one vocab modality); else None.
    Whoever holds the head holds this stage too, so its gradient sums both uses."""
    from spindle_dsl.cost.tied import tied_embedding_modality

    try:
        modality = tied_embedding_modality(graph, module)
    except ValueError as e:
        raise ExecutionError(str(e)) from None
    return None if modality is None else Part(module, f"input.{modality}")


def head_module(op: MetaOp) -> str:
    """The module whose head reads ``op``'s output: its last segment."""
    return op.segments[-1][0]


def graph_parts(graph: MetaGraph) -> tuple[Part, ...]:
    """Every part the active tasks use, in a fixed order (modules by declaration, then layers,
    input stages, head), with no duplicates."""
    needed: set[Part] = set()
    for op in graph.metaops:
        if op.batch <= 0:
            continue
        for name, count in op.segments:
            if count != graph.module(name).layers:
                raise ExecutionError(
                    f"{op.id} runs {count} layers of {name}, which has {graph.module(name).layers}"
                )
            needed.update(Part(name, f"layer.{j}") for j in range(count))
        for inp in op.inputs:
            if inp.from_modality:
                needed.add(Part(op.segments[0][0], f"input.{inp.source}"))
    for task in graph.tasks:
        if task.batch > 0 and task.loss == "lm":
            for s in task.sinks:
                module = head_module(graph.op(s))
                needed.add(Part(module, "head"))
                tied = tied_stage(graph, module)
                if tied is not None:
                    needed.add(tied)

    def order(p: Part) -> tuple[int, int, int, str]:
        mod = next(i for i, m in enumerate(graph.modules) if m.name == p.module)
        kind, _, rest = p.role.partition(".")
        rank = {"input": 0, "layer": 1, "head": 2}[kind]
        return (mod, rank, int(rest) if kind == "layer" else 0, rest)

    return tuple(sorted(needed, key=order))
