"""Parameter parts, the data source, the losses' shard arithmetic, and checkpoints, in-process."""

from __future__ import annotations

import handgraph as h
import pytest
import torch

from spindle_dsl.backends.torch import checkpoint as ck
from spindle_dsl.backends.torch import losses as L
from spindle_dsl.backends.torch.data import DictDataset, TaskData
from spindle_dsl.backends.torch.optim import ReplicatedAdamW
from spindle_dsl.backends.torch.params import PartStore, build_part
from spindle_dsl.backends.torch.parts import Part, graph_parts
from spindle_dsl.backends.torch.schedule import build_schedule
from spindle_dsl.errors import ExecutionError


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def test_a_part_is_the_same_whoever_builds_it_and_in_whatever_order():
    graph = h.tiny_mm()
    parts = graph_parts(graph)
    forward = PartStore(graph, parts, seed=3)
    backward = PartStore(graph, reversed(parts), seed=3)
    for p in parts:
        assert torch.equal(_flat(forward[p]), _flat(backward[p])), p
    alone = build_part(graph, Part("lm", "layer.4"), seed=3)
    assert torch.equal(_flat(alone), _flat(forward[Part("lm", "layer.4")]))
    # different layers and different seeds differ
    assert not torch.equal(_flat(forward[Part("lm", "layer.3")]), _flat(alone))
    assert not torch.equal(_flat(build_part(graph, Part("lm", "layer.4"), seed=4)), _flat(alone))
    # a float64 part holds exactly the float32 initial values
    wide = build_part(graph, Part("lm", "layer.4"), seed=3, dtype=torch.float64)
    assert torch.equal(_flat(wide), _flat(alone).double())


def test_frozen_parts_take_no_gradient():
    graph = h.clip_like()
    store = PartStore(graph, graph_parts(graph), seed=0)
    frozen = [p for p in store.parts if p.module == "img_enc"]
    assert frozen and all(not t.requires_grad for p in frozen for t in store[p].parameters())
    assert all(p.module != "img_enc" for p, _, _ in store.trainable())


def test_synthetic_rows_do_not_depend_on_how_the_batch_is_split():
    graph = h.tiny_mm()
    data = TaskData(graph, seed=1)
    whole = data.rows("caption", 2, 0, 24)
    parts = [data.rows("caption", 2, a, b) for a, b in ((0, 7), (7, 7), (7, 24))]
    for key, value in whole.items():
        assert torch.equal(value, torch.cat([p[key] for p in parts]))
    assert whole["text"].shape == (24, 12) and whole["text"].dtype == torch.long
    assert whole["image"].shape == (24, 16, 48)  # 3 x 4 x 4 pixels per patch
    assert data.rows("transcribe", 0, 0, 8)["text"].shape == (8, 8)  # text[8]
    assert not torch.equal(whole["image"], data.rows("caption", 3, 0, 24)["image"])
    assert torch.equal(TaskData(graph, seed=1).rows("caption", 2, 5, 9)["text"], whole["text"][5:9])


def test_a_bound_dataset_is_read_and_checked():
    graph = h.tiny_mm()
    n = 10
    ds = DictDataset(
        image=torch.randn(n, 16, 48),
        text=torch.arange(n * 12).reshape(n, 12) % 512,
    )
    data = TaskData(graph, seed=0, datasets={"caption": ds})
    rows = data.rows("caption", 1, 0, 24)  # step 1 reads samples 24..47, wrapping at 10
    assert torch.equal(rows["text"][0], ds[24 % n]["text"])
    bad = DictDataset(image=torch.randn(n, 16, 47), text=torch.zeros(n, 12, dtype=torch.long))
    with pytest.raises(ExecutionError, match=r"modality image: expected \(tokens, 48\)"):
        TaskData(graph, seed=0, datasets={"caption": bad})
    with pytest.raises(ExecutionError, match="gives no 'text'"):
        TaskData(graph, seed=0, datasets={"caption": DictDataset(image=torch.randn(n, 16, 48))})
    with pytest.raises(ExecutionError, match="unknown tasks: nope"):
        TaskData(graph, seed=0, datasets={"nope": ds})


def test_shard_shares_of_lm_and_mse_add_up_to_the_batch_mean():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False).double()
    out = torch.randn(6, 9, 8, dtype=torch.float64)
    ids = torch.randint(11, (6, 5))
    where = L.LmTarget("text", 4, 5)
    whole = L.lm_loss_part(head, out, ids, where, 6)
    shares = sum(L.lm_loss_part(head, out[a:b], ids[a:b], where, 6) for a, b in ((0, 4), (4, 6)))
    logits = head(out[:, 4:8])
    plain = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), ids[:, 1:5].reshape(-1))
    assert torch.allclose(whole, plain, rtol=1e-14) and torch.allclose(shares, plain, rtol=1e-14)
    target = torch.randn(6, 9, 8, dtype=torch.float64)
    mse = sum(L.mse_loss_part(out[a:b], target[a:b], 6) for a, b in ((0, 1), (1, 6)))
    assert torch.allclose(mse, torch.nn.functional.mse_loss(out, target), rtol=1e-14)


def test_infonce_is_symmetric_and_rewards_matching_pairs():
    a = L.readout(torch.randn(5, 3, 4))
    assert torch.allclose(L.infonce(a, a.flip(0)), L.infonce(a.flip(0), a))
    assert L.infonce(a, a) < L.infonce(a, a.roll(1, 0))


def test_losses_refuse_what_they_cannot_read():
    graph = h.clip_like()
    bad = graph.task("regress").__class__("regress", 5, None, "lm", ("regress/res",))
    with pytest.raises(ExecutionError, match="reads no token-id modality"):
        L.check_task(graph, bad)
    one = graph.task("image_text").__class__("x", 6, None, "contrastive", ("image_text/img_head",))
    with pytest.raises(ExecutionError, match="two sinks of equal width"):
        L.check_task(graph, one)


def _replicated(sched, store) -> ReplicatedAdamW:
    hyper = dict(lr=1e-2, weight_decay=0.0, betas=(0.9, 0.99), eps=1e-8)
    return ReplicatedAdamW(sched, 0, store, {}, **hyper)  # one rank: no process group needed


def test_checkpoint_round_trip_restores_parameters_and_adamw_state(tmp_path):
    graph = h.tiny_mm(1)
    sched = build_schedule(graph, h.sequential_plan(graph), 1)
    store = PartStore(graph, sched.parts_of(0), seed=0)
    params = [t for _, _, t in store.trainable()]
    opt = _replicated(sched, store)
    for t in params:
        t.grad = torch.ones_like(t)
    opt.step()
    ck.save(tmp_path, 1, sched, 0, store, opt, {"dtype": "float32", "seed": 0})
    assert (tmp_path / "latest").read_text().strip() == "step-000001"
    assert (tmp_path / "step-000001" / "lm" / "layer.5.pt").is_file()
    other = PartStore(graph, sched.parts_of(0), seed=9)
    other_params = [t for _, _, t in other.trainable()]
    other_opt = _replicated(sched, other)
    info = ck.latest(tmp_path)
    ck.load(info, other, other_opt)
    for a, b in zip(params, other_params, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(opt.opt.state[a]["exp_avg_sq"], other_opt.opt.state[b]["exp_avg_sq"])
        assert float(opt.opt.state[a]["step"]) == float(other_opt.opt.state[b]["step"]) == 1.0
    with pytest.raises(ExecutionError, match="written with dtype = float32"):
        ck.check_compatible(info, {"dtype": "float64"})


def test_a_heartbeat_overwrites_its_file_in_place(tmp_path):
    from spindle_dsl.backends.torch.launch import Heartbeat

    path = tmp_path / "heartbeat-0"
    path.write_text("starting")  # as the parent writes it
    beat = Heartbeat(path)
    beat.beat("step 12 wave 3 backward")
    assert path.read_text().strip() == "step 12 wave 3 backward"
    beat.beat("done")  # shorter: spaces cover the rest, nothing is truncated
    assert path.read_text().strip() == "done"
    assert len(path.read_text()) == len("step 12 wave 3 backward")
