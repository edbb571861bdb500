"""Training starts from a Hugging Face folder: a spec training a tiny Llama- or Qwen2-style
model saved with ``save_pretrained`` logs, on its first step, the loss transformers computes
for the same batch of token ids (``labels = input_ids``: next-token cross-entropy), on one
process and on two (the second reads only the tensors of the parts it holds)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers", reason="transformers is in the dev extra")

import torch
from tiny_models import save

from spindle_dsl.cli import main

SPEC = """
cluster {{ devices = {devices}; device = cpu }}
modality text {{ tokens = 16; vocab = 64 }}
module lm : hf("{name}")
task chat {{ text -> lm; loss = lm; batch = 4 }}
"""


def first_loss(tmp_path, name: str, nproc: int) -> tuple[float, float]:
    """(the first step's logged loss, transformers' loss on the same batch)."""
    model = save(name, tmp_path / name)
    ids = np.random.default_rng(1).integers(0, 64, size=(8, 16), dtype=np.int64)
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "text.npy", ids)
    spec = tmp_path / "job.spindle"
    spec.write_text(SPEC.format(devices=nproc, name=name))
    log = tmp_path / "log.jsonl"
    args = ["train", str(spec), "--steps", "1", "--data", f"chat={tmp_path / 'data'}"]
    args += ["--log-json", str(log), "--no-progress", "--nproc", str(nproc)]
    assert main(args) == 0
    ours = json.loads(log.read_text().splitlines()[0])["loss"]["chat"]
    batch = torch.from_numpy(ids[:4])
    with torch.no_grad():
        theirs = model(input_ids=batch, labels=batch).loss.item()
    return ours, theirs


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_the_first_loss_is_transformers_loss(tmp_path, name) -> None:
    ours, theirs = first_loss(tmp_path, name, 1)
    assert ours == pytest.approx(theirs, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_the_first_loss_is_transformers_loss_on_two_processes(tmp_path, name) -> None:
    ours, theirs = first_loss(tmp_path, name, 2)
    assert ours == pytest.approx(theirs, rel=1e-5)
