"""The lm loss scored by a tensor-parallel group split by vocabulary
(``losses.vocab_parallel_lm_loss_part``): on 2 and 3 gloo processes (41 entries, so 3 ranks
get uneven slices), in float64, every rank's loss equals the whole head's cross-entropy, and
the ranks' gradients of the head input, the head's matrix and its norm sum to the whole one's,
with ignored targets (-100) among the scored ones; an untied and a tied head."""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from spindle_dsl.backends.torch.launch import spawn
from spindle_dsl.backends.torch.losses import (
    LmTarget,
    lm_loss_part,
    vocab_bounds,
    vocab_parallel_lm_loss_part,
)
from spindle_dsl.kinds.layers import EmbeddingStage, LMHead

VOCAB, WIDTH, BATCH, TOKENS = 41, 8, 3, 7
WHERE = LmTarget("text", 2, 5)  # 5 text tokens after 2 media tokens: 4 scored positions


def _head(tied: bool) -> tuple[LMHead, EmbeddingStage | None]:
    torch.manual_seed(0)
    head = LMHead(WIDTH, VOCAB, norm="rmsnorm", tied=tied).double()
    stage = None
    if tied:
        stage = EmbeddingStage(VOCAB, TOKENS, WIDTH).double()
        head.tie_to(stage)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return head, stage


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    out = torch.randn(BATCH, TOKENS, WIDTH, dtype=torch.float64, generator=g)
    ids = torch.randint(0, VOCAB, (BATCH, WHERE.count), generator=g)
    targets = ids[:, 1:].clone()
    targets[0, 1] = targets[2, 3] = -100  # two positions score nothing
    return out, ids, targets


def _grads(tied: bool, split: tuple[Any, int, int] | None) -> tuple[float, list[torch.Tensor]]:
    """The loss and the gradients of (head input, matrix, norm) from the whole head, or from
    this rank's slice (``split``: group, rank, tp)."""
    head, stage = _head(tied)
    out, ids, targets = _inputs()
    out.requires_grad_()
    scored = int((targets != -100).sum())
    if split is None:
        loss = lm_loss_part(head, out, ids, WHERE, BATCH, targets=targets, scored=scored)
    else:
        group, rank, tp = split
        loss = vocab_parallel_lm_loss_part(
            head, out, ids, WHERE, BATCH, group, rank, tp, targets=targets, scored=scored
        )
    loss.backward()
    matrix = stage.embed.weight if stage is not None else head.weight
    return float(loss), [out.grad, matrix.grad, head.ln.weight.grad]  # type: ignore[list-item]


@dataclass(frozen=True)
class LossLaunch:
    """Every rank: the split loss and gradients, summed over the group, against the whole."""

    collective_timeout_s: float = 60.0

    @property
    def config(self) -> LossLaunch:
        return self

    def run_rank(
        self, rank: int, world: int, local: int, *, store: Any, heartbeat: Callable[[str], None]
    ) -> dict[str, float] | None:
        torch.set_num_threads(1)
        timeout = timedelta(seconds=self.collective_timeout_s)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        gaps: dict[str, float] = {}
        try:
            for tied in (False, True):
                whole_loss, whole = _grads(tied, None)
                loss, mine = _grads(tied, (None, rank, world))
                lo, hi = vocab_bounds(VOCAB, rank, world)
                # the matrix's gradient lands in this rank's rows only
                outside = torch.cat([mine[1][:lo], mine[1][hi:]]) if not tied else None
                for g in mine:
                    dist.all_reduce(g)
                label = "tied" if tied else "untied"
                gaps[f"{label} loss"] = abs(loss - whole_loss)
                for name, a, b in zip(("input", "matrix", "norm"), mine, whole, strict=True):
                    gaps[f"{label} {name}"] = float((a - b).abs().max())
                if outside is not None:
                    gaps["untied rows outside the slice"] = float(outside.abs().max())
            every: list[Any] = [None] * world
            dist.all_gather_object(every, gaps)
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return None
        return {k: max(g[k] for g in every) for k in gaps}


@pytest.mark.parametrize("world", [2, 3])
def test_a_vocabulary_split_loss_is_the_whole_heads(world: int) -> None:
    plain = importlib.import_module("test_vocab_parallel_loss")
    gaps = spawn(plain.LossLaunch(), world, hang_timeout_s=60.0)
    assert gaps and set(gaps) >= {"untied loss", "tied matrix", "untied rows outside the slice"}
    assert all(gap < 1e-12 for gap in gaps.values()), gaps


def test_the_vocabulary_slices_cover_it_once() -> None:
    for tp in (1, 2, 3, 4):
        bounds = [vocab_bounds(VOCAB, r, tp) for r in range(tp)]
        assert bounds[0][0] == 0 and bounds[-1][1] == VOCAB
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
