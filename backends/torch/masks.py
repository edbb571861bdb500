"""Variable-length rows: which positions of a MetaOp's tokens are real, and which text
positions an lm loss scores.

A task's data may give a row's length per modality (``NAME.len.npy``, or ``NAME.len`` in a
dataset's items): the first ``len`` tokens of the modality are real, the rest padding. It may
also give per-position targets for a token-id modality (``NAME.labels.npy`` / ``NAME.labels``,
aligned with the ids: position ``i`` predicts ``labels[i + 1]``, and ``-100`` scores nothing).
The rows carry them as ``len:NAME`` and ``labels:NAME`` (``TaskData.rows_at``).

A MetaOp reads its inputs concatenated along the tokens, so its mask is the concatenation of
its inputs' masks: a modality's from its lengths (all real without them), another MetaOp's
output mask, which is that MetaOp's input mask unless its layers change the number of tokens
(``out_tokens``: every pooled token is then real). Any rank computes the mask of any rows from
the data alone, so no mask travels between ranks. Where no input of a MetaOp's chain has
lengths there is no mask (``None``) and the layers run exactly as without this module.

The layers that take a mask say so (``takes_mask``): in attention, a padded position attends
only to itself and no other position attends to it; ``out_tokens`` pooling and contrastive
readouts average the real positions only; an lm loss scores the real targets only and divides
by their number over the whole batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.utils.checkpoint import checkpoint

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph, MetaOp

LEN = "len:"
LABELS = "labels:"
IGNORE = -100  # a target that scores nothing (torch's cross-entropy ignore_index)


def lengths_of(rows: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each modality's row lengths among ``rows`` (``TaskData.rows_at``'s ``len:`` entries)."""
    return {k[len(LEN) :]: v for k, v in rows.items() if k.startswith(LEN)}


def input_mask(
    graph: MetaGraph, op: MetaOp, lengths: Mapping[str, torch.Tensor], rows: int
) -> torch.Tensor | None:
    """(rows, op.tokens) booleans, True at real positions of ``op``'s concatenated inputs, or
    None where no input of its chain has lengths."""
    if not lengths:
        return None
    pieces, varies = [], False
    device = next(iter(lengths.values())).device
    for inp in op.inputs:
        if inp.from_modality:
            n = lengths.get(inp.source)
            varies = varies or n is not None
            if n is None:
                pieces.append(torch.ones(rows, inp.tokens, dtype=torch.bool, device=device))
            else:
                pieces.append(torch.arange(inp.tokens, device=device)[None, :] < n[:, None])
        else:
            upstream = output_mask(graph, graph.op(inp.source), lengths, rows)
            varies = varies or upstream is not None
            pieces.append(
                upstream
                if upstream is not None
                else torch.ones(rows, inp.tokens, dtype=torch.bool, device=device)
            )
    return torch.cat(pieces, dim=1) if varies else None


def output_mask(
    graph: MetaGraph, op: MetaOp, lengths: Mapping[str, torch.Tensor], rows: int
) -> torch.Tensor | None:
    """The mask of ``op``'s output: its input mask, or None (all real) where its layers pool
    to ``out_tokens``."""
    if op.out_tokens != op.tokens:
        return None
    return input_mask(graph, op, lengths, rows)


def call_layer(
    layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None, recompute: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run one layer (under activation checkpointing with ``recompute``) with the mask where
    there is one; the output and the mask of its tokens (None once a layer pools them)."""
    if mask is None:
        return (checkpoint(layer, x, use_reentrant=False) if recompute else layer(x)), None
    if not getattr(layer, "takes_mask", False):
        raise ExecutionError(
            f"{type(layer).__name__} takes no padding mask, but its rows have lengths "
            f"(len:... in the data): give every row its full length, or use a built-in kind"
        )
    y = checkpoint(layer, x, mask, use_reentrant=False) if recompute else layer(x, mask)
    return y, mask if y.shape[1] == mask.shape[1] else None


def check_stage_tokens(what: str, piece: torch.Tensor, tokens: int, varies: bool) -> None:
    """An input stage that adds tokens (a CLS token, a convolution stem) cannot be masked by
    its modality's lengths: refuse it rather than misplace the mask."""
    if varies and piece.shape[1] != tokens:
        raise ExecutionError(
            f"{what}: its input stage turns {tokens} tokens into {piece.shape[1]}, so the "
            f"modality's row lengths cannot mark its padding; give every row its full length"
        )


def target_scored(
    rows: Mapping[str, torch.Tensor], modality: str, count: int
) -> torch.Tensor | None:
    """(rows, count - 1) booleans: which next-token targets of ``count`` text positions an lm
    loss scores (the target within the row's length, its label not ``IGNORE``); None where the
    rows carry neither lengths nor labels (every target counts). Reads only ``len:`` and
    ``labels:`` entries."""
    n, labels = rows.get(f"{LEN}{modality}"), rows.get(f"{LABELS}{modality}")
    if n is None and labels is None:
        return None
    if labels is not None:
        keep = labels[:, 1:count] != IGNORE
    else:
        keep = torch.ones(len(n), count - 1, dtype=torch.bool, device=n.device)
    if n is not None:
        keep = keep & (torch.arange(1, count, device=keep.device)[None, :] < n[:, None])
    return keep


def lm_targets(rows: Mapping[str, torch.Tensor], modality: str, count: int) -> torch.Tensor | None:
    """The next-token targets of ``count`` text positions, (rows, count - 1): the ids (or the
    labels) one position on, ``IGNORE`` where nothing is scored; None where every target is
    scored."""
    keep = target_scored(rows, modality, count)
    if keep is None:
        return None
    labels = rows.get(f"{LABELS}{modality}")
    targets = (labels if labels is not None else rows[modality])[:, 1:count].clone()
    targets[~keep] = IGNORE
    return targets


def scored(keep: torch.Tensor | None, rows: int, count: int) -> int:
    """How many of ``rows`` rows' ``count - 1`` targets an lm loss scores (``keep``: from
    ``target_scored``, or the targets of ``lm_targets``)."""
    if keep is None:
        return rows * (count - 1)
    return int(keep.sum()) if keep.dtype == torch.bool else int((keep != IGNORE).sum())
