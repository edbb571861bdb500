"""Where each parameter of a tensor-parallel layer lives: layouts, weight mapping, feasibility.

A ``TpLayout`` says, for every parameter a built-in layer splits, along which dimension and in
which pieces it divides over the ``tp`` ranks of a tensor-parallel group; every parameter it
does not name is replicated (norms, the biases added after a row-parallel all-reduce, a
module's tail). A split parameter is a concatenation of ``Segment``s along its dimension (the
fused q/k/v weight: all query heads, then the K heads, then the V heads; SwiGLU's fused fc1:
gate, then up), and rank ``r`` holds the ``r``-th of ``tp`` equal slices *of every segment*,
concatenated in the same order. That is the only correct split of a fused matrix: its q rows
and the k/v rows of the same K/V-head groups, its gate rows and the same rows of up; a
contiguous ``1/tp`` of the whole matrix would mix them.

``split_state`` and ``merge_states`` map a layer's full state (as ``state_dict`` gives it) to a
rank's shard and back, bit for bit, so checkpoints hold full tensors whatever the degree and a
run resumes under another one; ``merge_states`` maps the shards' gradients to the full
layer's gradients the same way. ``tp_ok`` says why a kind's layer cannot run ``tp``-way, so
the cost model and the planner price only what the runtime executes.

Nothing here imports torch at module level (the splitting functions import it when called):
the layouts and ``tp_ok`` are plain arithmetic on a kind's arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spindle_dsl.errors import ExecutionError
from spindle_dsl.kinds.common import BlockShape

if TYPE_CHECKING:
    import torch

# Why each unit must divide evenly: the words of tp_ok's answer.
_UNIT_WHY = {
    "heads": "each rank holds whole attention heads",
    "kv_heads": "each rank holds whole K/V heads with the query heads they serve",
    "ffn": "each rank holds an equal slice of the feed-forward width",
    "hidden": "each rank holds an equal slice of the mlp's inner width",
    "out": "each rank holds an equal slice of the output width",
    "vocab": "each rank holds an equal slice of the vocabulary",
}


@dataclass(frozen=True)
class Segment:
    """``size`` consecutive entries of a split dimension, made of ``units`` indivisible units
    of the same width (``unit`` names them: ``kv_heads`` for q/k/v rows, ``ffn`` for
    feed-forward columns); a rank takes ``size / tp`` of them, which needs ``tp | units``."""

    size: int
    units: int
    unit: str

    def __post_init__(self) -> None:
        if self.units < 1 or self.size % self.units:
            raise ValueError(f"a segment of {self.size} cannot hold {self.units} equal units")


@dataclass(frozen=True)
class Split:
    """A parameter split along ``dim``: the concatenation of ``segments``, each divided into
    ``tp`` equal slices; rank ``r`` holds slice ``r`` of each, in segment order."""

    dim: int
    segments: tuple[Segment, ...]

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)


@dataclass(frozen=True)
class TpLayout:
    """How one layer's parameters divide over a tensor-parallel group: ``splits`` names each
    split parameter (a ``state_dict`` key); every other parameter is replicated."""

    what: str  # the layer, for messages
    splits: tuple[tuple[str, Split], ...]

    def split_of(self, name: str) -> Split | None:
        return dict(self.splits).get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.splits)

    def problem(self, tp: int) -> str | None:
        """Why this layer cannot split ``tp``-way, or None."""
        if tp < 1:
            return f"a tensor-parallel degree is at least 1, got {tp}"
        for _, split in self.splits:
            for seg in split.segments:
                if seg.units % tp:
                    why = _UNIT_WHY.get(seg.unit, f"each rank holds whole {seg.unit}")
                    return f"{seg.unit} = {seg.units} is not divisible by tp = {tp} ({why})"
        return None

    def under(self, prefix: str) -> TpLayout:
        """The same layout for the layer held as submodule ``prefix`` (``"stage."``)."""
        return TpLayout(self.what, tuple((prefix + n, s) for n, s in self.splits))


def combine(what: str, *layouts: TpLayout) -> TpLayout:
    """One layout for several layers held together (each ``under`` its own prefix)."""
    return TpLayout(what, tuple(item for layout in layouts for item in layout.splits))


# --- the layouts of the built-in layers ------------------------------------------------------


def _rows(*segments: Segment) -> Split:
    """Split along a Linear weight's output rows (column-parallel), or a bias."""
    return Split(0, segments)


def _cols(*segments: Segment) -> Split:
    """Split along a Linear weight's input columns (row-parallel)."""
    return Split(1, segments)


def ffn_layout(ffn: int, swiglu: bool, bias: bool, prefix: str = "") -> TpLayout:
    """A feed-forward net: fc1 column-parallel (SwiGLU's fused fc1 as gate and up, matching
    slices of each), fc2 row-parallel with its bias replicated (added once, after the sum)."""
    seg = Segment(ffn, ffn, "ffn")
    fc1 = _rows(seg, seg) if swiglu else _rows(seg)
    splits = [(f"{prefix}fc1.weight", fc1), (f"{prefix}fc2.weight", _cols(seg))]
    if bias:
        splits.insert(1, (f"{prefix}fc1.bias", fc1))
    return TpLayout("swiglu feed-forward" if swiglu else "feed-forward", tuple(splits))


def block_layout(shape: BlockShape) -> TpLayout:
    """A self-attention block: q/k/v by K/V-head groups (the query heads of a rank's K/V
    heads), the output projection row-parallel, the feed-forward net as ``ffn_layout``; the
    norms, the output bias and any tail replicated."""
    kv = shape.kv_heads
    unit = "heads" if kv == shape.heads else "kv_heads"  # GQA: whole K/V-head groups
    q = Segment(shape.q_width, kv, unit)
    k = Segment(shape.kv_width, kv, unit)
    qkv = _rows(q, k, k)
    splits: list[tuple[str, Split]] = [("qkv.weight", qkv)]
    if shape.qkv_bias and shape.has_k_bias:
        splits.append(("qkv.bias", qkv))
    elif shape.qkv_bias:  # Whisper: q and v biases held apart, none on k
        splits += [("q_bias", _rows(q)), ("v_bias", _rows(k))]
    splits.append(("proj.weight", _cols(q)))
    ffn = ffn_layout(shape.ffn, shape.act == "swiglu", shape.bias, prefix="ffn.")
    return TpLayout("self-attention block", (*splits, *ffn.splits))


def mlp_layout(n_in: int, n_out: int, hidden: int | None) -> TpLayout:
    """``MlpLayer``: with ``hidden``, column- then row-parallel over the inner width; a single
    Linear column-parallel over ``out``, its outputs gathered."""
    if hidden is None:
        out = _rows(Segment(n_out, n_out, "out"))
        return TpLayout("mlp layer", (("net.weight", out), ("net.bias", out)))
    seg = Segment(hidden, hidden, "hidden")
    splits = (
        ("net.0.weight", _rows(seg)),
        ("net.0.bias", _rows(seg)),
        ("net.2.weight", _cols(seg)),
    )
    return TpLayout("mlp layer", splits)


def head_layout(vocab: int | None) -> TpLayout:
    """``LMHead``: its matrix by vocabulary rows (a tied head has none: it multiplies by its
    embedding stage's slice); the norm replicated."""
    if vocab is None:
        return TpLayout("tied LM head", ())
    return TpLayout("LM head", (("out.weight", _rows(Segment(vocab, vocab, "vocab"))),))


def embedding_layout(vocab: int) -> TpLayout:
    """``EmbeddingStage``: the token embedding by vocabulary rows; the positions replicated."""
    return TpLayout("token embedding", (("embed.weight", _rows(Segment(vocab, vocab, "vocab"))),))


# --- feasibility -----------------------------------------------------------------------------


def kind_layout(kind: str, args: Mapping[str, object]) -> TpLayout | None:
    """The layout of one layer of built-in ``kind`` with resolved ``args``; None for a kind the
    runtime has no tensor-parallel form of (a user's kind, or the resampler)."""
    from spindle_dsl.kinds import get_kind
    from spindle_dsl.kinds.mlp import MlpKind
    from spindle_dsl.kinds.transformer import TransformerKind, VitKind

    k = get_kind(kind)
    if type(k) in (TransformerKind, VitKind):
        return block_layout(k.block(args))  # type: ignore[attr-defined, arg-type]
    if type(k) is MlpKind:
        hidden = args.get("hidden")
        n_in, n_out = int(args["in"]), int(args["out"])  # type: ignore[call-overload]
        return mlp_layout(n_in, n_out, None if hidden is None else int(hidden))  # type: ignore[call-overload]
    return None


def tp_ok(kind: str, args: Mapping[str, object], tp: int) -> str | None:
    """None if a layer of ``kind`` with ``args`` runs ``tp``-way in the runtime, else why not:
    heads, K/V heads, feed-forward or mlp width not divisible by ``tp``, or a kind the runtime
    has no tensor-parallel form of. Exact types only: a user's subclass of a built-in kind may
    build other layers, so it runs data parallel."""
    from spindle_dsl.kinds import get_kind

    if tp < 1:
        return f"a tensor-parallel degree is at least 1, got {tp}"
    try:
        resolved = get_kind(kind).resolve(args)  # type: ignore[arg-type]
    except KeyError:
        return f"unknown kind {kind!r}"
    if tp == 1:
        return None
    layout = kind_layout(kind, resolved)
    if layout is None:
        return (
            f"{kind}: the runtime has no tensor-parallel form of this kind's layers (only "
            f"transformer, vit and mlp layers split); it runs data parallel"
        )
    problem = layout.problem(tp)
    return None if problem is None else f"{kind}: {problem}"


def vocab_tp_ok(vocab: int, tp: int) -> str | None:
    """None if an LM head or token embedding of ``vocab`` rows splits ``tp``-way, else why
    not (such a piece can still run replicated beside tensor-parallel layers)."""
    return head_layout(vocab).problem(tp)


# --- weight and gradient mapping -------------------------------------------------------------


def _check_degree(layout: TpLayout, tp: int, tp_rank: int) -> None:
    problem = layout.problem(tp)
    if problem is not None:
        raise ExecutionError(f"cannot split a {layout.what} {tp}-way: {problem}")
    if not 0 <= tp_rank < tp:
        raise ExecutionError(f"tensor-parallel rank {tp_rank} is outside 0..{tp - 1}")


def slices(full: torch.Tensor, split: Split, tp_rank: int, tp: int) -> torch.Tensor:
    """Rank ``tp_rank``'s slice of every segment of ``full``, concatenated along the split
    dimension: a new tensor, through autograd when ``full`` carries a gradient (its gradient
    then lands in those rows of ``full``'s)."""
    import torch

    pieces, start = [], 0
    for seg in split.segments:
        step = seg.size // tp
        pieces.append(full.narrow(split.dim, start + tp_rank * step, step))
        start += seg.size
    return torch.cat(pieces, dim=split.dim)


def _take(full: torch.Tensor, split: Split, tp_rank: int, tp: int, name: str) -> torch.Tensor:
    """``slices`` of a state tensor, detached, after checking its shape."""
    if full.dim() <= split.dim or full.shape[split.dim] != split.size:
        raise ExecutionError(
            f"parameter {name} has shape {tuple(full.shape)}, but its layout splits "
            f"{split.size} entries along dimension {split.dim}"
        )
    return slices(full.detach(), split, tp_rank, tp)


def split_state(
    state: Mapping[str, torch.Tensor], tp_rank: int, tp: int, layout: TpLayout
) -> dict[str, torch.Tensor]:
    """Rank ``tp_rank``'s shard of a layer's full ``state`` (its ``state_dict``): split
    parameters sliced as ``layout`` says, the others copied whole. Every tensor returned is
    new (none aliases ``state``), so the full layer can be dropped."""
    _check_degree(layout, tp, tp_rank)
    missing = [n for n in layout.names if n not in state]
    if missing:
        raise ExecutionError(f"the {layout.what}'s state lacks {', '.join(missing)}")
    out = {}
    for name, full in state.items():
        split = layout.split_of(name)
        out[name] = (
            full.detach().clone() if split is None else _take(full, split, tp_rank, tp, name)
        )
    return out


def _join(shards: Sequence[torch.Tensor], split: Split, name: str) -> torch.Tensor:
    """The full tensor of one split parameter from every rank's shard, in rank order."""
    import torch

    tp = len(shards)
    local = split.size // tp
    for r, shard in enumerate(shards):
        if shard.dim() <= split.dim or shard.shape[split.dim] != local:
            raise ExecutionError(
                f"rank {r}'s shard of {name} has shape {tuple(shard.shape)}, but a {tp}-way "
                f"split holds {local} entries along dimension {split.dim}"
            )
    pieces, start = [], 0
    for seg in split.segments:
        step = seg.size // tp
        pieces += [s.detach().narrow(split.dim, start, step) for s in shards]
        start += step
    return torch.cat(pieces, dim=split.dim)


def merge_states(
    shards: Sequence[Mapping[str, torch.Tensor]],
    layout: TpLayout,
    *,
    check_replicas: bool = False,
) -> dict[str, torch.Tensor]:
    """The full tensors from every rank's shard (rank order): the inverse of ``split_state``,
    bit for bit. Works on gradients as on weights (the shards' ``.grad`` by name). A
    replicated tensor is taken from rank 0; ``check_replicas`` first makes sure every rank
    holds the very same one (the ranks of a group see the same rows, so their gradients of a
    replicated parameter must agree exactly)."""
    import torch

    if not shards:
        raise ExecutionError("merging a tensor-parallel state needs at least one shard")
    _check_degree(layout, len(shards), 0)
    names = list(shards[0])
    for r, shard in enumerate(shards):
        if set(shard) != set(names):
            raise ExecutionError(
                f"rank {r}'s shard holds {sorted(shard)}, rank 0's holds {sorted(names)}"
            )
    out = {}
    for name in names:
        split = layout.split_of(name)
        if split is not None:
            out[name] = _join([s[name] for s in shards], split, name)
            continue
        first = shards[0][name]
        if check_replicas and not all(torch.equal(s[name], first) for s in shards[1:]):
            raise ExecutionError(f"the replicas of {name} differ between tensor-parallel ranks")
        out[name] = first.detach().clone()
    return out
