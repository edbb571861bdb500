"""Moving batch shards between device groups of different sizes with batched point-to-point.

A flow takes a batch that is ceil-split over one group and re-splits it over another (a split
when the target group is larger, a gather when it is smaller, anything in between when they
overlap). Every rank walks the same list of flows of a phase in the same order and numbers the
moves as it goes, so each send meets its receive by (peer, tag) without any handshake; all the
sends and receives of a phase are posted together in one ``batch_isend_irecv`` and then waited
on, so no rank blocks while a peer waits for it. Rows a rank sends to itself are copied.

The same flows run backwards for gradients: the consumer's input gradient travels to the
producer along the mirrored moves, and the producer adds it to its output gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from .schedule import Flow, Move


class ReceivePool:
    """Persistent forward receive buffers, one per flow key, grown to the most rows asked."""

    def __init__(self, keep: Callable[[torch.Tensor, str], None] | None = None):
        self._buffers: dict[str, torch.Tensor] = {}
        self._keep = keep or (lambda _t, _what: None)

    def get(
        self, key: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A tensor of ``shape`` (a fresh leaf, no autograd history) on the flow's buffer."""
        buf = self._buffers.get(key)
        if (
            buf is None
            or buf.shape[0] < shape[0]
            or buf.shape[1:] != shape[1:]
            or (buf.dtype, buf.device) != (dtype, device)
        ):
            buf = torch.empty(shape, dtype=dtype, device=device)
            self._keep(buf, "buffers")
            self._buffers[key] = buf
        return buf[: shape[0]].detach()


def exchange(
    rank: int,
    flows: Sequence[Flow],
    send: Mapping[str, torch.Tensor],
    *,
    reverse: bool = False,
    dtype: torch.dtype,
    device: torch.device,
    pool: ReceivePool | None = None,
) -> dict[str, torch.Tensor]:
    """Run one phase's flows; return this rank's assembled shard of each flow it receives.

    ``send[key]`` is this rank's shard of the flow's source (forward: the producer's output
    shard; ``reverse``: the consumer's input-gradient shard). ``flows`` must be the whole
    phase, identical on every rank, even the flows this rank takes no part in. ``pool`` gives
    the receive buffers (forward only).
    """
    ops: list[dist.P2POp] = []
    received: dict[str, torch.Tensor] = {}
    tag = 0
    for flow in flows:
        if reverse and not flow.backward:
            continue
        src, dst = (flow.dst, flow.src) if reverse else (flow.src, flow.dst)
        flow_moves = flow.moves
        if reverse:  # the same overlaps, travelled the other way
            flow_moves = tuple(Move(m.dst, m.src, m.lo, m.hi) for m in flow_moves)
        if not (rank in src or rank in dst):
            tag += len(flow_moves)
            continue
        src_lo = flow.bounds(rank, source=not reverse)[0] if rank in src else 0
        buf = None
        dst_lo = 0
        if rank in dst:
            dst_lo, dst_hi = flow.bounds(rank, source=reverse)
            shape = (dst_hi - dst_lo, *flow.tail)
            if pool is not None and not reverse:
                buf = pool.get(flow.key, shape, dtype, device)
            else:
                buf = torch.empty(shape, dtype=dtype, device=device)
            received[flow.key] = buf
        source = send[flow.key].detach() if rank in src else None
        for mv in flow_moves:
            tag += 1
            if mv.src == rank and mv.dst == rank:
                assert buf is not None and source is not None
                buf[mv.lo - dst_lo : mv.hi - dst_lo] = source[mv.lo - src_lo : mv.hi - src_lo]
            elif mv.src == rank:
                assert source is not None
                rows = source[mv.lo - src_lo : mv.hi - src_lo].contiguous()
                ops.append(dist.P2POp(dist.isend, rows, mv.dst, tag=tag))
            elif mv.dst == rank:
                assert buf is not None
                ops.append(
                    dist.P2POp(dist.irecv, buf[mv.lo - dst_lo : mv.hi - dst_lo], mv.src, tag=tag)
                )
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return received
