"""The training recipe against the single-process oracle in float64: the learning-rate
schedule, a module's lr_scale, clipping by the global gradient norm (every parameter part
counted once, sharded under ZeRO-1/2, shared by several tasks' MetaOps, accumulated over
micro-batches) and evaluation on held-out data, on 2 and 4 processes.

The oracle clips with ``torch.nn.utils.clip_grad_norm_`` over its whole model; the runtime
sums the squares each rank owns and all-reduces them. Each multi-process run also steps
variants (other ZeRO stages and micro-batch counts) on the same processes.
"""

from __future__ import annotations

import handgraph as h
import pytest
import torch
from runtime_helpers import checkpoint_state, loss_errors, worst_relative

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import ReferenceModel, TorchBackend
from spindle_dsl.backends.torch import checkpoint as ck
from spindle_dsl.backends.torch.data import TaskData, synthesize
from spindle_dsl.backends.torch.optim import ReplicatedAdamW, make_optimizer
from spindle_dsl.backends.torch.params import PartStore
from spindle_dsl.backends.torch.schedule import build_schedule
from spindle_dsl.backends.torch.zero import ShardedAdamW
from spindle_dsl.errors import ExecutionError

STEPS = 3
HYPER = dict(lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99), eps=1e-8)


def _store(graph, sched, seed=0):
    return PartStore(graph, sched.parts_of(0), seed=seed, dtype=torch.float64)


def _grads(store, step):
    gen = torch.Generator().manual_seed(step)
    for _, _, t in store.trainable():
        t.grad = torch.randn(t.shape, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("sharded", [True, False])
def test_one_rank_clips_scales_and_schedules_as_torch_does(sharded):
    """With one rank every part has one holder: the optimizer's clipping, per-module rates
    and schedule must be torch's clip_grad_norm_ and parameter groups exactly."""
    graph = h.tiny_mm(1)
    sched = build_schedule(graph, h.sequential_plan(graph), 1)
    store, plain = _store(graph, sched), _store(graph, sched)
    kind = ShardedAdamW if sharded else ReplicatedAdamW
    extra = dict(reduce_scatter=True) if sharded else {}
    opt = kind(sched, 0, store, {}, clip_grad=0.5, lr_scales=(("lm", 0.25),), **extra, **HYPER)
    params = list(plain.trainable())
    scales = [0.25 if p.module == "lm" else 1.0 for p, _, _ in params]
    torch_opt = make_optimizer((t for _, _, t in params), scales=scales, **HYPER)
    for step, lr in enumerate((1e-2, 5e-3, 1e-3)):
        _grads(store, step)
        _grads(plain, step)
        norm = torch.nn.utils.clip_grad_norm_([t for _, _, t in params], 0.5)
        for group in torch_opt.param_groups:
            group["lr"] = lr * group["lr_scale"]
        stats = opt.step(lr)
        torch_opt.step()
        assert stats.total_sq == pytest.approx(float(norm) ** 2, rel=1e-12)
        assert stats.owned_sq == pytest.approx(stats.total_sq, rel=1e-12)
    for (_, _, a), (_, _, b) in zip(store.trainable(), plain.trainable(), strict=True):
        assert torch.allclose(a, b, rtol=1e-13, atol=1e-15)


def test_run_config_refuses_a_bad_recipe():
    with pytest.raises(ExecutionError, match="warmup_steps"):
        RunConfig(steps=3, warmup_steps=4)
    with pytest.raises(ExecutionError, match="min_lr"):
        RunConfig(lr=1e-3, min_lr=1e-2)
    with pytest.raises(ExecutionError, match="lr_decay"):
        RunConfig(lr_decay="cosin")  # type: ignore[arg-type]
    assert [RunConfig(steps=4, warmup_steps=2).lr_at(s) for s in range(4)] == [5e-4, 1e-3] + [
        1e-3
    ] * 2


def test_pruning_keeps_the_newest_complete_checkpoints(tmp_path):
    for step in (2, 4, 6):
        folder = ck.step_dir(tmp_path, step)
        folder.mkdir()
        (folder / "manifest.json").write_text(f'{{"format": "{ck.FORMAT}", "step": {step}}}')
    ck.step_dir(tmp_path, 5).mkdir()  # a half-written one, older than the newest
    (tmp_path / "latest").write_text("step-000006\n")
    removed = ck.prune(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["step-000002", "step-000005"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000004", "step-000006"]
    assert ck.latest(tmp_path).step == 6


def _oracle(graph, recipe, steps=STEPS, **extra):
    ref = ReferenceModel(graph, dtype="float64")
    history = ref.train(steps, lr=1e-2, **recipe, **extra)
    return ref, history


def _held_out(ref, graph, eval_datasets, batches):
    """The oracle's mean loss per task over the first held-out batches, at its weights."""
    data = TaskData(graph, 0, eval_datasets, torch.float64)
    model = ReferenceModel(graph, store=ref.store, data=data)
    with torch.no_grad():
        got = [model.losses(i) for i in range(batches)]
    return {t: sum(float(g[t]) for g in got) / batches for t in eval_datasets}


def _check(result, ref, history, ckpt):
    assert loss_errors(history, result.steps) < 1e-12
    for run in (result.steps, *result.extra["compared"]):
        assert loss_errors(history, run) < 1e-12
        for record, want in zip(run, ref.trained, strict=True):
            assert record.lr == pytest.approx(want.lr, rel=1e-15)
            assert record.grad_norm == pytest.approx(want.grad_norm, rel=1e-9)
    worst, where = worst_relative(ref.state(), checkpoint_state(ckpt))
    assert worst < 1e-9, f"{where}: {worst}"


@pytest.mark.slow
def test_four_ranks_clip_shared_and_sharded_parts_with_micro_batches(tmp_path):
    """clip_like on 4 ranks: contrastive tasks (cached over micro-batches), a shared text
    encoder, a frozen encoder; ZeRO-2 with 2 passes, ZeRO-1 with 3, ZeRO-0 with 1; held-out
    data for two of its three tasks."""
    graph = h.clip_like(4)
    plan = h.make_plan(graph, h.CLIP_WAVES)
    recipe = dict(warmup_steps=1, lr_decay="cosine", min_lr=1e-3, clip_grad=0.05)
    folders = synthesize(graph, tmp_path / "held", 16, seed=5)
    held = {t: str(folders[t]) for t in ("image_text", "regress")}
    config = RunConfig(
        steps=STEPS, lr=1e-2, dtype="float64", checkpoint_dir=str(tmp_path / "ckpt"),
        progress=False, micro_batches=2, zero_stage=2, eval_every=2, eval_batches=2, **recipe,
    )  # fmt: skip
    variants = (dict(micro_batches=3, zero_stage=1), dict(zero_stage=0))
    result = TorchBackend().train(
        graph, plan, config, nproc=4, compare=tuple((plan, v) for v in variants),
        eval_datasets=held,
    )  # fmt: skip
    ref, history = _oracle(graph, recipe)
    assert all(o.grad_norm > 0.05 for o in ref.trained)  # every step clips
    _check(result, ref, history, tmp_path / "ckpt")
    evaluated = [r.step for r in result.steps if r.eval_losses]
    assert evaluated == [2, 3]  # every 2 steps, and after the last
    want = _held_out(ref, graph, held, 2)
    got = dict(result.steps[-1].eval_losses)
    assert set(got) == set(held)
    assert all(abs(got[t] - want[t]) / abs(want[t]) < 1e-12 for t in held), (got, want)


@pytest.mark.slow
@pytest.mark.parametrize("clip", [0.3, 0.0])
def test_two_ranks_follow_the_oracle_with_and_without_clipping(tmp_path, clip):
    """tiny_mm on 2 ranks (lm shared by both tasks, every part on both ranks): ZeRO-1 with
    2 passes, ZeRO-2 and ZeRO-0; a linear decay and lm at a quarter of the rate. Without
    clipping the norm is still logged (each rank's squares summed with the losses)."""
    graph = h.tiny_mm(2)
    plan = h.sequential_plan(graph)
    recipe = dict(lr_decay="linear", min_lr=1e-3, clip_grad=clip, lr_scales=(("lm", 0.25),))
    config = RunConfig(
        steps=STEPS, lr=1e-2, dtype="float64", checkpoint_dir=str(tmp_path / "ckpt"),
        progress=False, micro_batches=2, zero_stage=1, **recipe,
    )  # fmt: skip
    variants = (dict(micro_batches=1, zero_stage=2), dict(zero_stage=0))
    result = TorchBackend().train(
        graph, plan, config, nproc=2, compare=tuple((plan, v) for v in variants)
    )
    ref, history = _oracle(graph, recipe)
    if clip:
        assert all(o.grad_norm > clip for o in ref.trained)
    _check(result, ref, history, tmp_path / "ckpt")
    assert [r.eval_losses for r in result.steps] == [None] * STEPS  # no held-out data
