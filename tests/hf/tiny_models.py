"""Tiny Hugging Face models built from configs (hidden 32, 2 layers) and saved as folders, the
way a user's downloaded checkpoint looks: ``config.json`` and ``model.safetensors``. Each is
seeded, so a test gets the same weights every run."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as T

LLAMA = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
    rms_norm_eps=1e-5,
    max_position_embeddings=64,
)
VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
IMAGE = dict(image_size=16, patch_size=4)  # 16 patches of 4 x 4

CONFIGS = {
    "llama": lambda: T.LlamaConfig(**LLAMA),
    "llama3": lambda: T.LlamaConfig(
        **LLAMA,
        attention_bias=True,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "mistral": lambda: T.MistralConfig(**LLAMA, sliding_window=None),
    "qwen2": lambda: T.Qwen2Config(**LLAMA, tie_word_embeddings=True),
    "vit": lambda: T.ViTConfig(**VISION, **IMAGE),
    "clip_vision": lambda: T.CLIPVisionConfig(**VISION, **IMAGE),
    "clip_text": lambda: T.CLIPTextConfig(
        **VISION,
        vocab_size=64,
        max_position_embeddings=16,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    ),
    "siglip_vision": lambda: T.SiglipVisionConfig(**VISION, **IMAGE),
    "whisper": lambda: T.WhisperConfig(
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_layers=1,
        decoder_attention_heads=4,
        decoder_ffn_dim=48,
        vocab_size=64,
        num_mel_bins=8,
        max_source_positions=12,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    ),
}
CLASSES = {
    "llama": T.LlamaForCausalLM,
    "llama3": T.LlamaForCausalLM,
    "mistral": T.MistralForCausalLM,
    "qwen2": T.Qwen2ForCausalLM,
    "vit": T.ViTModel,
    "clip_vision": T.CLIPVisionModel,
    "clip_text": T.CLIPTextModel,
    "siglip_vision": T.SiglipVisionModel,
    "whisper": T.WhisperModel,
}


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """The tiny model ``name``, its weights drawn from ``seed`` (biases and norms too, so a
    mapping that drops or swaps one shows)."""
    torch.manual_seed(seed)
    model = CLASSES[name](CONFIGS[name]()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 and p.numel() > 1 else 0.0))
    return model


def save(name: str, folder: Path, seed: int = 0) -> torch.nn.Module:
    """``build(name)`` saved with ``save_pretrained`` into ``folder``; the model."""
    model = build(name, seed)
    model.save_pretrained(folder)
    return model
