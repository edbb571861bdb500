"""``spindle check --json`` on a spec whose module is ``hf(DIR)``, DIR holding only the
published config.json of a model, counts exactly the parameters transformers builds for that
config (instantiated on the meta device, so a 7B model costs no memory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is in the dev extra")
torch = pytest.importorskip("torch")

from spindle_dsl.cli import main  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"

# (fixture, tower, the transformers model that holds those parameters)
MODELS = [
    ("llama2-7b", None, 6_738_415_616),
    ("llama3-8b", None, 8_030_261_248),
    ("llama3.1-8b", None, 8_030_261_248),
    ("mistral-7b", None, 7_241_732_096),
    ("qwen2-7b", None, 7_615_616_512),
    ("qwen2.5-0.5b", None, 494_032_768),
    ("vit-b16", None, 86_389_248),
    ("clip-vit-l14", "vision", 303_179_776),
    ("clip-vit-l14", "text", 123_060_480),
    ("siglip-base16", "vision", 92_884_224),
    ("whisper-base", None, 20_590_592),
]


def hf_params(folder: Path, tower: str | None) -> int:
    """``sum(p.numel())`` of the transformers model for ``folder``'s config."""
    cfg = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        if cfg.model_type in ("llama", "mistral", "qwen2"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
        elif cfg.model_type == "vit":
            model = transformers.ViTModel(cfg)
        elif cfg.model_type == "clip" and tower == "text":
            model = transformers.CLIPTextModel(cfg.text_config)
        elif cfg.model_type == "clip":
            model = transformers.CLIPVisionModel(cfg.vision_config)
        elif cfg.model_type == "siglip":
            model = transformers.SiglipVisionModel(cfg.vision_config)
        else:
            model = transformers.WhisperModel(cfg).encoder
    return sum(p.numel() for p in model.parameters())


def spec_for(folder: Path, tower: str | None) -> str:
    """A spec that runs the model on data shaped as its config says."""
    cfg = json.loads((folder / "config.json").read_text())
    if cfg["model_type"] in ("llama", "mistral", "qwen2"):
        data = f"modality text {{ tokens = 256; vocab = {cfg['vocab_size']} }}"
        return f'{data}\nmodule m : hf("{folder}")\ntask t {{ text -> m; loss = lm; batch = 4 }}\n'
    if cfg["model_type"] == "whisper":
        data, source = "modality audio { tokens = 3000; features = 80 }", "audio"
    elif tower == "text":
        data, source = "modality text { tokens = 77; vocab = 49408 }", "text"
    else:
        vision = cfg.get("vision_config", cfg)
        side = vision.get("image_size", 224) // vision.get("patch_size", 16)
        data, source = f"modality image {{ tokens = {side * side} }}", "image"
    encoder = f'encoder m : hf("{folder}") <- {source}'
    return f"{data}\n{encoder}\ntask t {{ {source} -> m; loss = mse; batch = 2 }}\n"


@pytest.mark.parametrize(
    ("name", "tower", "published"), MODELS, ids=[f"{n}-{t}" for n, t, _ in MODELS]
)
def test_check_counts_what_transformers_builds(name, tower, published, tmp_path, capsys) -> None:
    folder = FIXTURES / name
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]  # the config alone
    spec = tmp_path / "job.spindle"
    spec.write_text(spec_for(folder, tower))
    assert main(["check", str(spec), "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert totals["params"] == hf_params(folder, tower) == published
