"""Variable-length rows: a padded batch gives the losses and gradients of its rows computed one
by one without padding (causal and bidirectional attention, a resampler, out_tokens pooling,
contrastive readouts, an lm loss over real and labelled targets only), the runtime on 4
processes matches the oracle on such data, and the data files and their checks.
"""

from __future__ import annotations

import handgraph as h
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import DictDataset, ReferenceModel, TorchBackend
from spindle_dsl.backends.torch import losses as L
from spindle_dsl.backends.torch.data import TaskData, synthesize
from spindle_dsl.backends.torch.datafiles import write_task_folder
from spindle_dsl.backends.torch.parts import Part
from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import ModalityInfo

ROWS = 4
TEXT_LEN = torch.tensor([10, 6, 3, 8])
IMU_LEN = torch.tensor([6, 2, 5, 4])


def graph():
    """An lm task (an image prefix, then text), and two contrastive tasks reading text and
    imu rows of varying length through a bidirectional encoder, a resampler and a pooling mlp."""
    return h.lower(
        {
            "vision": ("vit", dict(layers=1, hidden=32, heads=2, patch=4), False),
            "lm": ("transformer", dict(layers=2, hidden=32, heads=2, causal=True, vocab=50), False),
            "enc": ("transformer", dict(layers=2, hidden=16, heads=2, vocab=50), False),
            "imu_enc": ("transformer", dict(layers=1, hidden=16, heads=2), False),
            "res": ("resampler", {"in": 16, "hidden": 16, "heads": 2, "out_tokens": 3}, False),
            "squeeze": ("mlp", {"in": 16, "out": 16, "out_tokens": 2}, False),
        },
        [
            ModalityInfo("image", 4),
            ModalityInfo("text", 10, vocab=50),
            ModalityInfo("imu", 6, features=5),
        ],
        {
            "caption": (
                [("image", "vision", None), ("vision", "lm", None), ("text", "lm", None)],
                ROWS,
                "lm",
            ),
            "pair": (
                [("text", "enc", None), ("imu", "imu_enc", None), ("imu_enc", "res", None)],
                ROWS,
                "contrastive",
            ),
            "pooled": (
                [("text", "enc", None), ("enc", "squeeze", None), ("imu", "imu_enc", None)],
                ROWS,
                "contrastive",
            ),
        },
        devices=1,
    )


def columns() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(50, (ROWS, 10), generator=gen)
    labels[0, :3] = -100  # a prompt: scored by nothing
    labels[3, 5] = -100
    return {
        "image": torch.randn(ROWS, 4, 48, generator=gen),
        "text": torch.randint(50, (ROWS, 10), generator=gen),  # padding holds any ids
        "text.len": TEXT_LEN,
        "text.labels": labels,
        "imu": torch.randn(ROWS, 6, 5, generator=gen),
        "imu.len": IMU_LEN,
    }


def _grads(model: ReferenceModel, total: torch.Tensor) -> list[torch.Tensor]:
    params = [t for _, _, t in model.store.trainable()]
    return list(torch.autograd.grad(total, params, allow_unused=True))


def _one_by_one(model: ReferenceModel, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each task's loss from its rows run one at a time, cut to their lengths (no mask)."""
    g = model.graph
    scored, total, readouts = 0, 0.0, {"pair": ([], []), "pooled": ([], [])}
    for i in range(ROWS):
        n, k = int(TEXT_LEN[i]), int(IMU_LEN[i])
        row = {"image": data["image"][i : i + 1].double(), "text": data["text"][i : i + 1, :n],
               "imu": data["imu"][i : i + 1, :k].double()}  # fmt: skip
        out = model.forward(g.task("caption"), row)["caption/lm"]
        head = model.store[Part("lm", "head")]
        logits = head(out[:, 4 : 4 + n - 1])  # after the 4 image tokens
        targets = data["text.labels"][i, 1:n]
        total = total + F.cross_entropy(logits[0], targets, reduction="sum")
        scored += int((targets != -100).sum())
        for task in ("pair", "pooled"):
            acts = model.forward(g.task(task), row)
            for side, sink in zip(readouts[task], g.task(task).sinks, strict=True):
                side.append(L.readout(acts[sink]))
    out = {"caption": total / scored}
    for task, (a, b) in readouts.items():
        out[task] = L.infonce(torch.cat(a), torch.cat(b))
    return out


def test_a_padded_batch_is_its_rows_one_by_one():
    data = columns()
    model = ReferenceModel(
        graph(), dtype="float64", datasets={t: DictDataset(**data) for t in ("caption", "pair",
                                                                               "pooled")},
    )  # fmt: skip
    padded = model.losses(0)
    single = _one_by_one(model, data)
    for task in padded:
        assert float(padded[task].detach()) == pytest.approx(
            float(single[task].detach()), rel=1e-12
        ), task
    a = _grads(model, sum(padded.values()))
    b = _grads(model, sum(single.values()))
    for x, y in zip(a, b, strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.allclose(x, y, rtol=1e-10, atol=1e-13)
    # the padding matters to nothing: other ids and features there give the same losses
    noisy = dict(data, text=data["text"].clone(), imu=data["imu"].clone())
    for i in range(ROWS):
        noisy["text"][i, int(TEXT_LEN[i]) :] = 7
        noisy["imu"][i, int(IMU_LEN[i]) :] = 1e3
    again = ReferenceModel(
        graph(), dtype="float64", datasets={t: DictDataset(**noisy) for t in padded}
    ).losses(0)
    assert all(
        float(again[t].detach()) == pytest.approx(float(padded[t].detach()), rel=1e-12)
        for t in padded
    )


@pytest.mark.slow
def test_four_ranks_train_variable_length_rows_as_the_oracle(tmp_path):
    """tiny_mm and clip_like with lengths from ``spindle data synth --variable-length``: the
    runtime's masks, computed per shard from the data, give the oracle's losses exactly."""
    for name, waves in (("tiny_mm", h.TINY_WAVES), ("clip_like", h.CLIP_WAVES)):
        g = getattr(h, name)(4)
        plan = h.make_plan(g, waves)
        folders = synthesize(g, tmp_path / name, 40, seed=1, variable_length=True)
        data = {t: str(p) for t, p in folders.items()}
        config = RunConfig(steps=2, dtype="float64", progress=False, micro_batches=2)
        result = TorchBackend().train(
            g, plan, config, nproc=4, datasets=data, compare=((plan, {"micro_batches": 1}),)
        )
        history = ReferenceModel(g, dtype="float64", datasets=data).train(2)
        for run in (result.steps, result.extra["compared"][0]):
            for want, record in zip(history, run, strict=True):
                for task, value in record.losses:
                    assert value == pytest.approx(want[task], rel=1e-12), (name, task)


@pytest.mark.slow
def test_two_ranks_train_variable_length_rows_as_the_oracle_under_zero_1_and_2(tmp_path):
    """tiny_mm on 2 ranks (every part on both) with variable-length rows: ZeRO-1 with 2
    micro-batches, ZeRO-2 with 2 and with 1, all equal to the oracle's losses, which sees
    each padded batch whole."""
    g = h.tiny_mm(2)
    plan = h.sequential_plan(g)
    folders = synthesize(g, tmp_path / "data", 24, seed=3, variable_length=True)
    data = {t: str(p) for t, p in folders.items()}
    config = RunConfig(steps=2, dtype="float64", progress=False, micro_batches=2, zero_stage=1)
    variants = (dict(zero_stage=2), dict(zero_stage=2, micro_batches=1))
    result = TorchBackend().train(
        g, plan, config, nproc=2, datasets=data, compare=tuple((plan, v) for v in variants)
    )
    history = ReferenceModel(g, dtype="float64", datasets=data).train(2)
    for run in (result.steps, *result.extra["compared"]):
        for want, record in zip(history, run, strict=True):
            for task, value in record.losses:
                assert value == pytest.approx(want[task], rel=1e-12), task


def test_synth_writes_lengths_and_folders_check_them(tmp_path, spec_dir):
    from spindle_dsl.cli import main

    spec = str(spec_dir / "tiny_mm.spindle")
    assert main(["data", "synth", spec, "--samples", "3", "--out", str(tmp_path / "cli"),
                 "--variable-length"]) == 0  # fmt: skip
    assert (tmp_path / "cli" / "caption" / "text.len.npy").is_file()
    g = h.tiny_mm(1)
    folders = synthesize(g, tmp_path / "d", 6, variable_length=True)
    assert {p.name for p in folders["transcribe"].iterdir()} == {
        "audio.npy", "audio.len.npy", "text.npy", "text.len.npy"
    }  # fmt: skip
    lengths = np.load(folders["caption"] / "text.len.npy")
    assert lengths.shape == (6,) and ((lengths >= 6) & (lengths <= 12)).all()
    rows = TaskData(g, 0, {"caption": str(folders["caption"])}).rows("caption", 0, 0, 6)
    assert rows["len:text"].tolist() == lengths.tolist()
    assert (rows["text"][0, int(lengths[0]) :] == 0).all()
    bad = tmp_path / "bad"
    write_task_folder(bad, {"image": np.zeros((2, 16, 48), np.float32),
                            "text": np.zeros((2, 12), np.int64),
                            "image.len": np.array([3, 4])})  # fmt: skip
    with pytest.raises(ExecutionError, match="image rows have no lengths"):
        TaskData(g, 0, {"caption": str(bad)})
    labels = tmp_path / "labels"
    write_task_folder(labels, {"image": np.zeros((2, 16, 48), np.float32),
                               "text": np.zeros((2, 12), np.int64),
                               "text.labels": np.full((2, 12), 600)})  # fmt: skip
    data = TaskData(g, 0, {"caption": str(labels)})
    with pytest.raises(ExecutionError, match=r"labels must lie in \[0, 512\) or be -100"):
        data.rows("caption", 0, 0, 2)
