"""Building parameter parts from the kinds registry, identically on every rank and in the oracle.

Each part is built under its own forked RNG seeded from (seed, module, part), so a rank that
builds three layers of a module gets bit-for-bit the tensors a single process building the
whole model gets: nothing depends on what else is built or in which order. Parts are built in
float32 on the CPU (as the kinds initialise them) and only then cast and moved, so float64 and
CUDA runs start from the same numbers. A module declared ``from "w.safetensors"`` then takes
its tensors from that file (``weights.py``), cast to the training dtype.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from dataclasses import replace

import torch
from torch import nn

from spindle_dsl.errors import ExecutionError
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph, ModalityInfo

from .parts import Part, part_seed, tied_stage
from .weights import load_part

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def _layer(kind, args: dict, *, last: bool) -> nn.Module:
    """``build_layer(args, last=...)`` where the kind takes ``last``, else ``build_layer(args)``
    (the contract's form: a user kind need not know about pooling)."""
    if "last" in inspect.signature(kind.build_layer).parameters:
        return kind.build_layer(args, last=last)
    return kind.build_layer(args)


def _stage_modality(graph: MetaGraph, module: str, modality: str) -> ModalityInfo:
    """The modality as ``module``'s input stage sees it: as many tokens as the most any task
    feeds it (``text[2048]`` beside ``text``). Graphs that do not record ``raw_inputs`` (built
    by hand) get the figure from their MetaOps' input edges."""
    if modality in dict(graph.module(module).raw_inputs):
        return graph.stage_modality(module, modality)
    fed = [
        i.tokens
        for op in graph.metaops
        if op.segments[0][0] == module
        for i in op.inputs
        if i.from_modality and i.source == modality
    ]
    info = graph.modality(modality)
    return replace(info, tokens=max(fed, default=info.tokens))


def construct_part(graph: MetaGraph, part: Part) -> nn.Module:
    """The PyTorch module of ``part`` as its kind builds it, on the current default device and
    RNG (``build_part`` seeds it; under ``torch.device("meta")`` it costs no memory, which is
    how the weights check learns every parameter's name and shape)."""
    info = graph.module(part.module)
    kind, args = get_kind(info.kind), dict(info.args)
    what, _, rest = part.role.partition(".")
    try:
        if what == "layer":
            module = _layer(kind, args, last=int(rest) == info.layers - 1)
        elif what == "input":
            module = kind.build_input_stage(args, _stage_modality(graph, part.module, rest))
        elif what == "head":
            module = kind.build_head(args)
            if module is None:
                raise ExecutionError(
                    f"module {part.module} ({info.kind}) has no LM head, so a task cannot "
                    f"use loss = lm on it; give the sink a causal transformer with a vocab"
                )
        else:
            raise ExecutionError(f"unknown parameter part {part.key}")
    except (TypeError, ValueError, AssertionError) as exc:
        raise ExecutionError(f"cannot build {part.key} ({info.kind}): {exc}") from None
    return module


def build_part(
    graph: MetaGraph,
    part: Part,
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """The PyTorch module of ``part``: seeded, or loaded from its module's ``from`` file (each
    process reads only the tensors of the parts it builds); frozen if the module is."""
    info = graph.module(part.module)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(part_seed(seed, part))
        module = construct_part(graph, part)
    module = module.to(dtype=dtype, device=device)
    if info.weights and os.path.isdir(info.weights):  # a Hugging Face folder
        from spindle_dsl.hf.load import load_part as load_hf_part

        load_hf_part(graph, part.module, part.role, module)
    elif info.weights:
        load_part(info.weights, part, module)
    if info.frozen:
        module.requires_grad_(False)
    return module


class PartStore(nn.Module):
    """The parts one process holds, by key. A rank holds a subset; the oracle holds them all."""

    def __init__(
        self,
        graph: MetaGraph,
        parts: Iterable[Part],
        seed: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        given: Mapping[Part, nn.Module] | None = None,
    ):
        """``given``: parts this process already holds (a run moving to the next phase of a
        schedule keeps them as they are); the others are built."""
        super().__init__()
        self.parts = tuple(parts)
        # ModuleDict keys may not contain '.', so index by position and keep a map.
        self._index = {p: i for i, p in enumerate(self.parts)}
        given = given or {}
        self.mods = nn.ModuleList(
            given[p] if p in given else build_part(graph, p, seed, dtype, device)
            for p in self.parts
        )
        self._tie_heads(graph)

    def _tie_heads(self, graph: MetaGraph) -> None:
        """Hand each tied LM head the input stage whose embedding it multiplies by (the
        schedule puts that stage on every rank holding the head)."""
        for part in self.parts:
            tied = tied_stage(graph, part.module) if part.role == "head" else None
            if tied is None:
                continue
            if tied not in self:
                raise ExecutionError(f"internal: {part.key} is tied to {tied.key}, not held here")
            self[part].tie_to(self[tied])

    def __getitem__(self, part: Part) -> nn.Module:
        try:
            return self.mods[self._index[part]]
        except KeyError:
            raise ExecutionError(f"internal: this rank does not hold {part.key}") from None

    def __contains__(self, part: object) -> bool:
        return part in self._index

    def trainable(self) -> list[tuple[Part, str, nn.Parameter]]:
        """(part, parameter name, parameter) of every parameter that takes gradients, in a
        fixed order shared by all holders (parts in schedule order, names in module order)."""
        return [
            (p, name, t)
            for p in self.parts
            for name, t in self[p].named_parameters()
            if t.requires_grad
        ]

    def fill_missing_grads(self) -> None:
        """Zero gradients where a parameter got none (an empty shard, an unused row): every
        holder then reduces and steps the same set, as the oracle does."""
        for _, _, t in self.trainable():
            if t.grad is None:
                t.grad = torch.zeros_like(t)
