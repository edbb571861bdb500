"""The sharded optimizer's layout and arithmetic, in one process (no process group needed: with
one rank every part has one holder, so nothing is communicated). The multi-process checks (the
shards each rank holds, the results against the oracle) are in test_exact_hand.py."""

from __future__ import annotations

import handgraph as h
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spindle_dsl.backends.torch import checkpoint as ck
from spindle_dsl.backends.torch.grads import _fill_rows, _read_rows
from spindle_dsl.backends.torch.optim import ReplicatedAdamW, make_optimizer
from spindle_dsl.backends.torch.params import PartStore
from spindle_dsl.backends.torch.parts import Part
from spindle_dsl.backends.torch.schedule import build_schedule
from spindle_dsl.backends.torch.shards import PartShard, plan_buckets
from spindle_dsl.backends.torch.zero import ShardedAdamW

HYPER = dict(lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99), eps=1e-8)

holder_sets = st.sampled_from([(0,), (0, 1), (1, 2, 3), (0, 1, 2, 3), (2, 5)])


@given(
    parts=st.lists(st.tuples(holder_sets, st.integers(0, 50)), min_size=1, max_size=12),
    cap=st.integers(1, 120),
)
def test_buckets_split_every_part_over_its_holders_exactly_once(parts, cap):
    held = [(Part("m", f"layer.{i}"), holders, n) for i, (holders, n) in enumerate(parts)]
    buckets = plan_buckets(held, cap)
    placed = [ps for b in buckets for ps in b.parts]
    # every part with elements is placed once, with its own holders
    assert sorted(ps.part for ps in placed) == sorted(p for p, _, n in held if n > 0)
    assert all(ps.holders == dict((p, r) for p, r, _ in held)[ps.part] for ps in placed)
    for b in buckets:
        assert all(ps.holders == b.holders for ps in b.parts)
        # slots tile each row; a bucket of several parts stays under the cap
        assert [ps.offset for ps in b.parts] == [
            sum(q.slot for q in b.parts[:i]) for i in range(len(b.parts))
        ]
        assert len(b.parts) == 1 or b.chunk * len(b.holders) <= cap
        for ps in b.parts:
            covered = [e for r in ps.holders for e in range(*ps.bounds(r))]
            assert covered == list(range(ps.numel))  # contiguous shards, in holder order
            assert max(hi - lo for lo, hi in map(ps.bounds, ps.holders)) == ps.slot
    # buckets come in the backward's order of their first part (later parts first): ranks
    # sharing two sets agree on it
    firsts = [next(i for i, (p, _, _) in enumerate(held) if p == b.parts[0].part) for b in buckets]
    assert firsts == sorted(firsts, reverse=True)


@given(numel=st.integers(1, 40), k=st.integers(1, 6), before=st.integers(0, 5))
def test_rows_hold_each_holders_shard_and_give_the_part_back(numel, k, before):
    ps = PartShard(Part("m", "layer.0"), numel, tuple(range(k)), before)
    rows = torch.full((k, before + ps.slot + 2), -1.0)
    flat = torch.arange(float(numel))
    _fill_rows(rows, ps, [(flat[:3], min(3, numel)), (flat[3:], max(numel - 3, 0))])
    for i in range(k):
        lo, hi = ps.bounds(i)
        assert torch.equal(rows[i, before : before + hi - lo], flat[lo:hi])
    back = [torch.empty(numel // 2), torch.empty(numel - numel // 2)]  # the part's tensors
    _read_rows(rows, ps, back)
    assert torch.equal(torch.cat(back), flat)
    assert (rows[:, :before] == -1).all() and (rows[:, before + ps.slot :] == -1).all()


def _setup(dtype=torch.float64, seed=0):
    graph = h.tiny_mm(1)
    sched = build_schedule(graph, h.sequential_plan(graph), 1)
    return graph, sched, PartStore(graph, sched.parts_of(0), seed=seed, dtype=dtype)


def _grads(store, step):
    gen = torch.Generator().manual_seed(step)
    for _, _, t in store.trainable():
        t.grad = torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)


def test_sharded_step_is_torch_adamw_bit_for_bit_and_checkpoints_cross_over(tmp_path):
    _, sched, store = _setup()
    _, _, plain = _setup()
    sharded = ShardedAdamW(sched, 0, store, {}, reduce_scatter=True, **HYPER)
    torch_opt = make_optimizer((t for _, _, t in plain.trainable()), **HYPER)
    for step in range(3):
        _grads(store, step)
        _grads(plain, step)
        sharded.step()
        torch_opt.step()
        torch_opt.zero_grad(set_to_none=True)
    for (_, _, a), (_, _, b) in zip(store.trainable(), plain.trainable(), strict=True):
        assert torch.equal(a, b) and a.grad is None
    n = sum(t.numel() for _, _, t in store.trainable())
    assert sum(sharded.state_elements().values()) == 2 * n
    assert sharded.state_bytes() == 2 * n * 8
    # a checkpoint of the sharded optimizer resumes an unsharded one exactly, and back
    ck.save(tmp_path, 3, sched, 0, store, sharded, {})
    _, _, resumed = _setup(seed=5)
    replicated = ReplicatedAdamW(sched, 0, resumed, {}, **HYPER)
    ck.load(ck.latest(tmp_path), resumed, replicated)
    _grads(resumed, 3)
    _grads(store, 3)
    replicated.step()
    sharded.step()
    for (_, _, a), (_, _, b) in zip(store.trainable(), resumed.trainable(), strict=True):
        assert torch.equal(a, b)
    ck.save(tmp_path / "back", 4, sched, 0, resumed, replicated, {})
    _, _, again = _setup(seed=6)
    reloaded = ShardedAdamW(sched, 0, again, {}, reduce_scatter=False, **HYPER)
    ck.load(ck.latest(tmp_path / "back"), again, reloaded)
    assert reloaded.steps[Part("lm", "layer.0")] == 4
    for part, shard in sharded.state.items():
        assert torch.equal(shard.exp_avg_sq, reloaded.state[part].exp_avg_sq), part


def test_bf16_weights_step_fp32_master_weights_that_checkpoints_keep(tmp_path):
    graph, sched, store = _setup(torch.bfloat16)
    wide = PartStore(graph, sched.parts_of(0), seed=0, dtype=torch.float32)
    with torch.no_grad():  # the fp32 reference starts from the very bf16 values
        for (_, _, a), (_, _, b) in zip(store.trainable(), wide.trainable(), strict=True):
            b.copy_(a.float())
    sharded = ShardedAdamW(sched, 0, store, {}, reduce_scatter=True, **HYPER)
    torch_opt = make_optimizer((t for _, _, t in wide.trainable()), **HYPER)
    for step in range(2):
        _grads(store, step)
        for (_, _, a), (_, _, b) in zip(store.trainable(), wide.trainable(), strict=True):
            b.grad = a.grad.float()
        sharded.step()
        torch_opt.step()
    part = Part("lm", "layer.1")
    shard = sharded.state[part]
    assert shard.master is not None and shard.master.dtype == torch.float32
    assert shard.exp_avg.dtype == torch.float32
    master_want = torch.cat([t.detach().reshape(-1) for t in wide[part].parameters()])
    assert torch.equal(shard.master, master_want)  # fp32 steps, exactly as fp32 AdamW
    assert torch.equal(
        torch.cat([t.detach().reshape(-1) for t in store[part].parameters()]),
        master_want.to(torch.bfloat16),
    )
    n = sum(t.numel() for _, _, t in store.trainable())
    assert sharded.state_bytes() == 3 * n * 4  # m, v and master, fp32
    ck.save(tmp_path, 2, sched, 0, store, sharded, {})
    _, _, back = _setup(torch.bfloat16, seed=3)
    restored = ShardedAdamW(sched, 0, back, {}, reduce_scatter=True, **HYPER)
    ck.load(ck.latest(tmp_path), back, restored)
    assert torch.equal(restored.state[part].master, master_want)  # not re-read from bf16


def test_unusable_saved_state_is_refused(tmp_path):
    from spindle_dsl.errors import ExecutionError

    _, sched, store = _setup()
    sharded = ShardedAdamW(sched, 0, store, {}, reduce_scatter=True, **HYPER)
    part = Part("lm", "layer.0")
    saved = {n: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}
             for n, _ in store[part].named_parameters()}  # fmt: skip
    with pytest.raises(
        ExecutionError, match=r"saved optimizer state of lm/layer.0:\S+ is unusable"
    ):
        sharded.load_part_state(part, saved)


@pytest.mark.slow
def test_bf16_on_two_processes_keeps_fp32_state_and_masters_for_its_shard_only():
    from runtime_helpers import loss_errors

    from spindle_dsl.backends.base import RunConfig
    from spindle_dsl.backends.torch import ReferenceModel, TorchBackend
    from spindle_dsl.backends.torch.schedule import shard_bounds

    graph = h.tiny_mm(2)
    plan = h.sequential_plan(graph)  # every part on both ranks: each keeps half of each
    config = RunConfig(steps=2, dtype="bfloat16", progress=False)
    result = TorchBackend().train(graph, plan, config, nproc=2)
    ref = ReferenceModel(graph)
    assert loss_errors(ref.train(2), result.steps) < 1e-2  # bf16 rounding, not a wrong model
    for part in ref.store.parts:
        n = sum(t.numel() for t in ref.store[part].parameters())
        halves = [hi - lo for lo, hi in shard_bounds(n, 2)]
        # exp_avg, exp_avg_sq and the master weights, for its own half alone
        assert [r.get(part.key, 0) for r in result.extra["optimizer_state"]] == [
            3 * x for x in halves
        ]
    assert result.extra["optimizer_state_bytes"] == [
        4 * sum(r.values()) for r in result.extra["optimizer_state"]
    ]
