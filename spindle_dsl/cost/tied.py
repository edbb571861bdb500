"""Which input stage a tied LM head multiplies by.

A module that ties its LM head to its token embedding (``tie_embeddings = true``) has no head
matrix of its own: the head reads the embedding of the module's one token-id modality. The
runtime therefore holds that input stage on the head's devices as well as on the first
layer's, and its gradient sums both uses; the memory and step models must place it there
too, or they under-count the head ranks' state and the stage's reduction. One function, so
the planner's models and the runtime cannot disagree on which stage it is.
"""

from __future__ import annotations

from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaGraph


def tied_embedding_modality(graph: MetaGraph, module: str) -> str | None:
    """The token-id modality whose input stage ``module``'s LM head multiplies by, or None
    when the module does not tie them. Raises ValueError when a tying module reads other
    than exactly one token-id modality (the checker rejects such specs)."""
    info = graph.module(module)
    if not get_kind(info.kind).tied_embeddings(dict(info.args)):
        return None
    raw = {m for m, _ in info.raw_inputs} or {  # a graph built by hand records no raw_inputs
        i.source
        for op in graph.metaops
        if op.segments[0][0] == module
        for i in op.inputs
        if i.from_modality
    }
    vocab = sorted(m for m in raw if graph.modality(m).vocab is not None)
    if len(vocab) != 1:
        raise ValueError(
            f"module {module} ties its head to its token embedding but reads "
            f"{len(vocab)} token-id modalities; it must read exactly one"
        )
    return vocab[0]
