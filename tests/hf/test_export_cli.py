"""``spindle export --format hf`` after training: each module a folder, the Hugging Face ones
loading in transformers with no missing or unexpected keys, the adapter in the project's
format beside them, and every tensor read back (hf() for the folders, ``from`` for the
adapter) bit-identical to the trained checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers", reason="transformers is in the dev extra")

import torch
import transformers
from parity import state
from tiny_models import save

from spindle_dsl.backends.torch.export import checkpoint_tensors
from spindle_dsl.cli import main
from spindle_dsl.language import compile_text

SPEC = """
cluster {{ devices = 1; device = cpu }}
modality image {{ tokens = 16 }}
modality text {{ tokens = 8; vocab = 64 }}
encoder vision : hf("{vision}") <- image frozen
module proj : mlp(in = 32, out = 32){proj}
module lm : hf("{lm}")
task caption {{ image -> vision -> proj -> lm; text -> lm; loss = lm; batch = 2 }}
"""


def test_trained_modules_export_as_folders_and_read_back(tmp_path, capsys) -> None:
    save("siglip_vision", tmp_path / "siglip")
    save("qwen2", tmp_path / "qwen2")
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "image.npy", rng.standard_normal((4, 3, 16, 16)).astype(np.float32))
    np.save(data / "text.npy", rng.integers(0, 64, size=(4, 8)))
    spec = tmp_path / "vlm.spindle"
    spec.write_text(SPEC.format(vision="siglip", lm="qwen2", proj=""))
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    train = ["train", str(spec), "--steps", "2", "--data", f"caption={data}", "--no-progress"]
    assert main([*train, "--checkpoint-dir", str(ckpt)]) == 0
    assert (
        main(["export", str(spec), "--format", "hf", "-o", str(out), "--checkpoint-dir", str(ckpt)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "out/vision (siglip_vision_model folder)" in printed
    assert "out/proj (the project's format)" in printed
    for name, cls in (
        ("vision", transformers.SiglipVisionModel),
        ("lm", transformers.Qwen2ForCausalLM),
    ):
        _, info = cls.from_pretrained(out / name, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)

    graph = compile_text(spec.read_text(), str(spec)).graph
    trained, step = checkpoint_tensors(graph, ckpt)
    assert step == 2
    again = SPEC.format(
        vision="out/vision", lm="out/lm", proj=' from "out/proj/weights.safetensors"'
    )
    back = state(compile_text(again, str(spec)).graph)
    trained = {k.replace(".", "/", 1): t for k, t in trained.items()}
    assert back.keys() == trained.keys()
    assert all(torch.equal(back[k], trained[k]) for k in back)
