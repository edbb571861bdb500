"""Tensor-parallel layers (``tensor_parallel.py``, ``tp_split.py``): on 2 and 4 gloo processes,
every built-in layer variant sharded tp-way computes the full layer's output, input gradient
and (merged) parameter gradients to 1e-10 in float64; a flipped convention (contiguous halves
of SwiGLU's fused fc1, q/k/v split without its K/V groups) makes that comparison fail; the
weight mapping round-trips bit for bit; ``tp_ok`` says which splits the runtime can run.

The process tests run on workers of the runtime's own launcher (``launch.spawn``: the job
pickled to each rank, which imports this module, a loopback store, gloo on loopback): one
launch of 2 ranks (tp = 2) and one of 4 (tp = 4, and two tp = 2 groups side by side) run every
case, and the tests read the launch's results.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from spindle_dsl.backends.torch.launch import spawn
from spindle_dsl.backends.torch.masks import call_layer
from spindle_dsl.backends.torch.tensor_parallel import ShardView, layout_of, shard_layer
from spindle_dsl.errors import ExecutionError
from spindle_dsl.kinds import base as kinds_base
from spindle_dsl.kinds import get_kind
from spindle_dsl.kinds.common import BlockShape
from spindle_dsl.kinds.layers import (
    EmbeddingStage,
    FeedForward,
    LMHead,
    MlpLayer,
    ResamplerLayer,
    SelfAttentionBlock,
    SwiGLUFeedForward,
)
from spindle_dsl.kinds.mlp import MlpKind
from spindle_dsl.kinds.tp_split import (
    Segment,
    Split,
    TpLayout,
    combine,
    merge_states,
    split_state,
    tp_ok,
    vocab_tp_ok,
)

TOL = 1e-10
FAIL = 1e-3  # a flipped convention is off by far more than this

GPT = BlockShape(hidden=32, heads=4, kv_heads=4, ffn=64)
# Llama: SwiGLU, RMSNorm, rotary, grouped-query attention, no biases
LLAMA = BlockShape(32, 4, 2, 48, act="swiglu", norm="rmsnorm", bias=False, qkv_bias=False,
                   rotary=True)  # fmt: skip
# Qwen-like: as Llama with biases on q/k/v, and heads enough for tp = 4
QWEN = BlockShape(32, 8, 4, 48, act="swiglu", norm="rmsnorm", bias=False, qkv_bias=True,
                  rotary=True)  # fmt: skip
WHISPER = BlockShape(32, 4, 4, 64, k_bias=False)  # q and v biases, none on k
QUICK = BlockShape(32, 4, 4, 64, act="quick_gelu")


class Pair(nn.Module):
    """A token embedding and the LM head tied to it: ids -> logits."""

    def __init__(self, stage: nn.Module, head: nn.Module):
        super().__init__()
        self.stage, self.head = stage, head
        head.tie_to(stage)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.stage(ids)))


@dataclass(frozen=True)
class Case:
    """A full layer and its inputs (the first one a float input or token ids, then a mask)."""

    layer: nn.Module
    inputs: tuple[torch.Tensor | None, ...]
    layout: TpLayout
    wrong: TpLayout | None = None  # a flipped layout, which must make the comparison fail
    recompute: bool = False  # run as the executor does with recompute: checkpointed


def _randomised(layer: nn.Module) -> nn.Module:
    """The layer in float64 with every parameter random (biases and norm weights included,
    so a bias added tp times or a norm weight misplaced shows)."""
    layer = layer.double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return layer


def _x(batch: int, tokens: int, width: int) -> torch.Tensor:
    return torch.randn(batch, tokens, width, dtype=torch.float64)


def _mask(lengths: list[int], tokens: int) -> torch.Tensor:
    return torch.arange(tokens)[None, :] < torch.tensor(lengths)[:, None]


def _with(layout: TpLayout, changes: dict[str, Split]) -> TpLayout:
    return TpLayout(layout.what, tuple((n, changes.get(n, s)) for n, s in layout.splits))


def _block(shape: BlockShape, causal: bool, out_tokens: int | None = None) -> nn.Module:
    return _randomised(SelfAttentionBlock(shape, causal, out_tokens))


def _vit_last_layer() -> nn.Module:
    kind = get_kind("vit")
    args = kind.resolve(
        {"layers": 1, "hidden": 32, "heads": 4, "patch": 2, "pool": "map", "output": "pooled"}
    )
    return _randomised(kind.build_layer(args, last=True))


def _pair() -> Pair:
    stage = EmbeddingStage(40, tokens=6, width=32, learned=True, tied=True)
    return _randomised(Pair(stage, LMHead(32, 40, norm="layernorm", tied=True)))


def _parts(layer: nn.Module, *inputs: torch.Tensor | None) -> tuple:
    return layer, inputs, layout_of(layer)


def _plain(layer: nn.Module, *inputs: torch.Tensor | None) -> Case:
    return Case(*_parts(layer, *inputs))


def _case_builders() -> dict[str, Callable[[], Case]]:
    swiglu_fc1 = Split(0, (Segment(96, 96, "rows"),))  # contiguous halves of [gate; up]
    qkv_rows = Split(0, (Segment(QWEN.qkv_width, QWEN.qkv_width, "rows"),))
    return {
        "gpt_block": lambda: _plain(_block(GPT, False), _x(2, 4, 32)),
        "llama_gqa_block": lambda: _plain(_block(LLAMA, True), _x(2, 5, 32)),
        "qwen_gqa_block": lambda: _plain(_block(QWEN, True), _x(2, 5, 32)),
        "whisper_block": lambda: _plain(_block(WHISPER, False), _x(2, 4, 32)),
        "padded_pooled_block": lambda: _plain(
            _block(QUICK, True, out_tokens=2), _x(3, 5, 32), _mask([5, 3, 1], 5)
        ),
        "padded_block_recomputed": lambda: Case(
            *_parts(_block(LLAMA, True), _x(3, 5, 32), _mask([2, 5, 4], 5)), recompute=True
        ),
        "vit_last_block": lambda: _plain(_vit_last_layer(), _x(2, 4, 32)),
        "gelu_ffn": lambda: _plain(_randomised(FeedForward(32, 64, act="gelu_tanh")), _x(2, 3, 32)),
        "swiglu_ffn": lambda: _plain(_randomised(SwiGLUFeedForward(32, 48)), _x(2, 3, 32)),
        "mlp_hidden": lambda: _plain(_randomised(MlpLayer(24, 16, 32, None)), _x(2, 3, 24)),
        "mlp_linear_pooled": lambda: _plain(
            _randomised(MlpLayer(24, 16, None, out_tokens=2)), _x(3, 4, 24), _mask([4, 2, 3], 4)
        ),
        "lm_head": lambda: _plain(_randomised(LMHead(32, 40, norm="rmsnorm")), _x(2, 3, 32)),
        "tied_embedding_head": lambda: _tied_case(),
        "flip_swiglu_halves": lambda: _flipped(_block(QWEN, True), {"ffn.fc1.weight": swiglu_fc1}),
        "flip_qkv_groups": lambda: _flipped(
            _block(QWEN, True), {"qkv.weight": qkv_rows, "qkv.bias": qkv_rows}
        ),
    }


def _tied_case() -> Case:
    pair = _pair()
    layout = combine(
        "tied pair", layout_of(pair.stage).under("stage."), layout_of(pair.head).under("head.")
    )
    ids = torch.randint(0, 40, (3, 6))
    return Case(pair, (ids,), layout)


def _flipped(layer: nn.Module, changes: dict[str, Split]) -> Case:
    layout = layout_of(layer)
    return Case(layer, (_x(2, 5, 32),), layout, _with(layout, changes))


CASES = tuple(_case_builders())
FLIPS = tuple(c for c in CASES if c.startswith("flip_"))
EXPECTED_ERRORS = {
    ("tp4", name): "kv_heads = 2 is not divisible by tp = 4"
    for name in ("llama_gqa_block", "padded_block_recomputed")
}


def build_case(name: str) -> Case:
    torch.manual_seed(sum(map(ord, name)))
    return _case_builders()[name]()


# --- one rank's side of the comparison ---------------------------------------------------------


def _run(module: nn.Module, inputs: tuple, dy: torch.Tensor | None, recompute: bool = False):
    """Forward and backward: the output, the input gradient (None for ids) and the
    parameter gradients by name. ``recompute`` calls the layer as the executor does for a
    MetaOp that recomputes (``masks.call_layer``: the forward's collectives run again in
    backward)."""
    first = inputs[0]
    if first.is_floating_point():
        first = first.clone().requires_grad_()
    if recompute:
        out = call_layer(module, first, inputs[1], recompute=True)[0]
    else:
        out = module(first, *inputs[1:])
    if dy is None:
        dy = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(7))
    out.backward(dy)
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return out.detach(), first.grad if first.is_floating_point() else None, grads, dy


def _sharded(case: Case, tp_rank: int, tp: int, group: Any) -> nn.Module:
    if isinstance(case.layer, Pair):
        stage = shard_layer(case.layer.stage, tp_rank, tp, group)
        return Pair(stage, shard_layer(case.layer.head, tp_rank, tp, group))
    module = shard_layer(case.layer, tp_rank, tp, group)
    if case.wrong is not None:
        module.load_state_dict(split_state(case.layer.state_dict(), tp_rank, tp, case.wrong))
    return module


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def compare(name: str, tp_rank: int, tp: int, group: Any) -> dict[str, Any]:
    """This rank's errors against the full layer, and the spread of what must be identical
    on every rank of the group (the output, the replicated parameters' gradients)."""
    case = build_case(name)
    out, dx, grads, dy = _run(case.layer, case.inputs, None)
    try:
        module = _sharded(case, tp_rank, tp, group)
    except ExecutionError as e:
        return {"error": str(e)}
    got, got_dx, got_grads, _ = _run(module, case.inputs, dy, case.recompute)
    shards: list[Any] = [None] * tp
    dist.all_gather_object(shards, (got, got_grads), group=group)
    merged = merge_states([g for _, g in shards], case.layout)
    spread = max(_gap(o, got) for o, _ in shards)
    for n, g in merged.items():
        if case.layout.split_of(n) is None:
            spread = max(spread, *(_gap(s[n], g) for _, s in shards))
    return {
        "out": _gap(got, out),
        "dx": 0.0 if dx is None else _gap(got_dx, dx),
        "grads": max(_gap(merged[n], g) for n, g in grads.items()),
        "same_names": sorted(merged) == sorted(grads),
        "spread": spread,
        **_view_gaps(case, tp_rank, tp, group, (out, dx, grads, dy)),
    }


def _view_gaps(case: Case, tp_rank: int, tp: int, group: Any, full: tuple) -> dict[str, float]:
    """How far the runtime's ``ShardView`` of a whole copy of the layer is from the full
    layer: its output and input gradient on this rank, and the sum over the group of its
    gradients of the whole parameters (what the reduction over the holders adds up)."""
    if isinstance(case.layer, Pair) or case.wrong is not None:
        return {}
    out, dx, grads, dy = full
    layer = copy.deepcopy(case.layer)
    layer.zero_grad(set_to_none=True)
    got, got_dx, _, _ = _run(ShardView(layer, tp_rank, tp, group), case.inputs, dy, case.recompute)
    summed = {}
    for n, p in layer.named_parameters():
        g = p.grad.clone()
        dist.all_reduce(g, group=group)
        summed[n] = g
    return {
        "view_out": _gap(got, out),
        "view_dx": 0.0 if dx is None else _gap(got_dx, dx),
        "view_grads": max(_gap(summed[n], g) for n, g in grads.items()),
    }


def _worse(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two ranks' results as one: the larger error, the first message."""
    if "error" in a or "error" in b:
        return a if "error" in a else b
    return {k: (a[k] and b[k]) if isinstance(a[k], bool) else max(a[k], b[k]) for k in a}


@dataclass(frozen=True)
class CaseLaunch:
    """What every rank of a launch runs: each case at each setup of its world size, the
    results of all ranks joined on rank 0 (the worst error, the first message)."""

    collective_timeout_s: float = 120.0

    @property
    def config(self) -> CaseLaunch:  # the launcher reads ``job.config.collective_timeout_s``
        return self

    def run_rank(
        self, rank: int, world: int, local: int, *, store: Any, heartbeat: Callable[[str], None]
    ) -> dict[str, Any] | None:
        torch.set_num_threads(1)
        timeout = timedelta(seconds=self.collective_timeout_s)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        try:
            setups = [("tp2", None, 2, rank)]
            if world == 4:
                pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
                setups = [("tp4", None, 4, rank), ("tp2x2", pairs[rank // 2], 2, rank % 2)]
            mine = {}
            for label, group, tp, r in setups:
                for name in CASES:
                    heartbeat(f"{label} {name}")
                    mine[f"{label}:{name}"] = compare(name, r, tp, group)
            every: list[Any] = [None] * world
            dist.all_gather_object(every, mine)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return None
        joined = dict(every[0])
        for other in every[1:]:
            joined = {k: _worse(v, other[k]) for k, v in joined.items()}
        return joined


# --- the process tests -------------------------------------------------------------------------


def _launch(world: int) -> dict[str, Any]:
    """Run every case on ``world`` ranks and return rank 0's joined results. The job is made
    from this module imported under its plain name, which the workers import too (this
    folder is on their path, as it is on the tests')."""
    plain = importlib.import_module("test_tensor_parallel")
    return spawn(plain.CaseLaunch(), world, hang_timeout_s=120.0)


@pytest.fixture(scope="module")
def launched() -> Callable[[str], dict[str, Any]]:
    """The results of the launch a setup runs in (each launch runs once per module)."""
    held: dict[int, dict[str, Any]] = {}

    def results(label: str) -> dict[str, Any]:
        world = 2 if label == "tp2" else 4
        if world not in held:
            held[world] = _launch(world)
        return held[world]

    return results


SETUPS = ("tp2", "tp4", "tp2x2")


@pytest.mark.slow
@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("name", [c for c in CASES if c not in FLIPS])
def test_a_sharded_layer_computes_the_full_layer(launched, setup, name):
    got = launched(setup)[f"{setup}:{name}"]
    expected_error = EXPECTED_ERRORS.get((setup, name))
    if expected_error is not None:
        assert expected_error in got.get("error", ""), got
        return
    assert "error" not in got, got.get("error")
    assert got["same_names"], got
    assert got["out"] < TOL and got["dx"] < TOL and got["grads"] < TOL, got
    if "view_out" in got:  # the whole layer's slice, as the runtime runs it
        assert max(got["view_out"], got["view_dx"], got["view_grads"]) < TOL, got
    # every rank of a group holds the same output and the same replicated gradients, so the
    # replicated parameters stay identical step after step
    assert got["spread"] == 0.0, got


@pytest.mark.slow
@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("name", FLIPS)
def test_a_flipped_convention_breaks_the_comparison(launched, setup, name):
    got = launched(setup)[f"{setup}:{name}"]
    assert "error" not in got, got
    assert got["out"] > FAIL and got["grads"] > FAIL, got


# --- in one process ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_split_then_merge_gives_back_the_same_tensors(name):
    case = build_case(name)
    state = case.layer.state_dict()
    for tp in (1, 2, 4):
        if case.layout.problem(tp) is not None:
            continue
        shards = [split_state(state, r, tp, case.layout) for r in range(tp)]
        merged = merge_states(shards, case.layout)
        assert list(merged) == list(state)
        for n, t in state.items():
            assert merged[n].dtype == t.dtype and torch.equal(merged[n], t), n
        if tp == 2 and case.layout.problem(4) is None:  # resume under another degree
            again = split_state(merged, 3, 4, case.layout)
            direct = split_state(state, 3, 4, case.layout)
            assert all(torch.equal(again[n], direct[n]) for n in direct)


@pytest.mark.parametrize("name", ["gpt_block", "llama_gqa_block", "whisper_block", "mlp_hidden"])
def test_a_shard_holds_the_split_state_under_the_full_layers_names(name):
    case = build_case(name)
    for r in range(2):
        module = shard_layer(case.layer, r, 2)  # no group needed to build
        want = split_state(case.layer.state_dict(), r, 2, case.layout)
        have = module.state_dict()
        assert list(have) == list(want)
        assert all(have[n].shape == want[n].shape and torch.equal(have[n], want[n]) for n in want)


def test_the_fused_layouts_take_matching_slices():
    """Rank 1 of 2 of the Llama block: q rows of its K/V head (query heads 2 and 3), then that
    K head's rows, then its V head's rows; SwiGLU's fc1: the second half of gate, then the
    second half of up."""
    hd = LLAMA.head_dim
    full = torch.arange(LLAMA.qkv_width * 2, dtype=torch.float64).view(-1, 2)
    state = {"qkv.weight": full}
    layout = TpLayout(
        "test", (("qkv.weight", layout_of(_block(LLAMA, True)).split_of("qkv.weight")),)
    )
    got = split_state(state, 1, 2, layout)["qkv.weight"]
    q, kv = LLAMA.q_width, LLAMA.kv_width
    rows = [*range(2 * hd, 4 * hd), *range(q + hd, q + 2 * hd), *range(q + kv + hd, q + 2 * kv)]
    assert torch.equal(got, full[rows])
    fc1 = layout_of(SwiGLUFeedForward(8, 6)).split_of("fc1.weight")
    assert fc1 is not None
    up_gate = torch.arange(12, dtype=torch.float64)[:, None]
    got = split_state({"fc1.weight": up_gate}, 1, 2, TpLayout("t", (("fc1.weight", fc1),)))
    assert got["fc1.weight"].flatten().tolist() == [3.0, 4.0, 5.0, 9.0, 10.0, 11.0]


@pytest.mark.parametrize("name", [c for c in CASES if c not in FLIPS])
def test_one_way_is_the_full_layer(name):
    """tp = 1 communicates nothing and needs no group: exactly the full layer."""
    case = build_case(name)
    out, dx, grads, dy = _run(case.layer, case.inputs, None)
    layer = case.layer
    module = (
        Pair(shard_layer(layer.stage, 0, 1), shard_layer(layer.head, 0, 1))
        if isinstance(layer, Pair)
        else shard_layer(layer, 0, 1)
    )
    got, got_dx, got_grads, _ = _run(module, case.inputs, dy)
    assert _gap(got, out) < TOL and (dx is None or _gap(got_dx, dx) < TOL)
    assert sorted(got_grads) == sorted(grads)
    assert max(_gap(got_grads[n], g) for n, g in grads.items()) < TOL


def test_impossible_splits_are_clear_errors():
    llama = _block(LLAMA, True)
    with pytest.raises(ExecutionError, match="kv_heads = 2 is not divisible by tp = 4"):
        shard_layer(llama, 0, 4)
    with pytest.raises(ExecutionError, match="ffn = 48 is not divisible by tp = 5"):
        shard_layer(_randomised(SwiGLUFeedForward(32, 48)), 0, 5)
    with pytest.raises(ExecutionError, match="vocab = 40 is not divisible by tp = 3"):
        shard_layer(_randomised(LMHead(32, 40)), 0, 3)
    with pytest.raises(ExecutionError, match=r"rank 2 is outside 0\.\.1"):
        shard_layer(llama, 2, 2)
    with pytest.raises(ExecutionError, match="ResamplerLayer has no tensor-parallel form"):
        shard_layer(ResamplerLayer(16, 32, 4, 2, 64), 0, 2)
    with pytest.raises(ExecutionError, match="Linear has no tensor-parallel form"):
        shard_layer(nn.Linear(4, 4), 0, 2)
    layout = layout_of(llama)
    shards = [split_state(llama.state_dict(), r, 2, layout) for r in range(2)]
    shards[1]["qkv.weight"] = shards[1]["qkv.weight"][:-1]
    with pytest.raises(ExecutionError, match=r"rank 1's shard of qkv\.weight has shape"):
        merge_states(shards, layout)
    shards = [split_state(llama.state_dict(), r, 2, layout) for r in range(2)]
    shards[1]["ln1.weight"] = shards[1]["ln1.weight"] + 1.0
    with pytest.raises(ExecutionError, match=r"replicas of ln1\.weight differ"):
        merge_states(shards, layout, check_replicas=True)


class _MyMlp(MlpKind):
    """A user's kind that happens to extend a built-in one: it may build other layers."""

    name = "tp_test_my_mlp"


def test_tp_ok_says_which_splits_the_runtime_runs(monkeypatch):
    gpt = {"layers": 2, "hidden": 32, "heads": 4}
    assert tp_ok("transformer", gpt, 1) is None
    assert tp_ok("transformer", gpt, 2) is None and tp_ok("transformer", gpt, 4) is None
    assert "heads = 4 is not divisible by tp = 3" in tp_ok("transformer", gpt, 3)
    gqa = {**gpt, "kv_heads": 2, "act": "swiglu", "ffn": 48}
    assert tp_ok("transformer", gqa, 2) is None
    assert "kv_heads = 2 is not divisible by tp = 4" in tp_ok("transformer", gqa, 4)
    assert "ffn = 50 is not divisible by tp = 4" in tp_ok("transformer", {**gpt, "ffn": 50}, 4)
    vit = {"layers": 1, "hidden": 48, "heads": 6, "patch": 2}
    assert tp_ok("vit", vit, 2) is None and "heads = 6" in tp_ok("vit", vit, 4)
    assert tp_ok("mlp", {"in": 8, "out": 8, "hidden": 8}, 4) is None
    assert "hidden = 6 is not divisible by tp = 4" in tp_ok(
        "mlp", {"in": 8, "out": 8, "hidden": 6}, 4
    )
    assert "out = 6 is not divisible by tp = 4" in tp_ok("mlp", {"in": 8, "out": 6}, 4)
    resampler = {"in": 16, "hidden": 32, "heads": 4, "out_tokens": 2}
    assert "no tensor-parallel form" in tp_ok("resampler", resampler, 2)
    monkeypatch.setitem(kinds_base._REGISTRY, _MyMlp.name, _MyMlp())
    assert tp_ok(_MyMlp.name, {"in": 8, "out": 8}, 1) is None
    assert "no tensor-parallel form" in tp_ok(_MyMlp.name, {"in": 8, "out": 8}, 2)
    assert "unknown kind" in tp_ok("no_such_kind", {}, 2)
    assert "at least 1" in tp_ok("transformer", gpt, 0)
    assert vocab_tp_ok(40, 4) is None and "vocab = 50 is not divisible" in vocab_tp_ok(50, 4)


@pytest.mark.parametrize("tp", [2, 3, 4])
@pytest.mark.parametrize(
    "kind, args",
    [
        ("transformer", {"layers": 1, "hidden": 24, "heads": 6, "kv_heads": 2, "ffn": 36}),
        ("transformer", {"layers": 1, "hidden": 32, "heads": 4, "act": "swiglu", "ffn": 40}),
        ("mlp", {"in": 8, "out": 12, "hidden": 20}),
        ("mlp", {"in": 8, "out": 12}),
    ],
)
def test_tp_ok_agrees_with_what_shard_layer_accepts(kind, args, tp):
    k = get_kind(kind)
    layer = k.build_layer(k.resolve(args))
    reason = tp_ok(kind, args, tp)
    if reason is None:
        shard_layer(layer, 0, tp)
    else:
        with pytest.raises(ExecutionError):
            shard_layer(layer, 0, tp)
