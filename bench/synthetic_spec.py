"""A generator of large multi-task specs for planning-time sweeps (up to 65,536 devices, 50 tasks).

Tasks route one or two modality encoders through a per-task adapter into one of two shared
language models, the shape of the paper's workloads scaled out. Sizes are drawn from a fixed
seed so every run plans the same spec.

``large=True`` scales the same shape up until memory binds, as it does for real multi-task
jobs: H100s, encoders of 1-2k hidden and 24-48 layers, a 7B and a 3B language model, longer
text and a global batch of 8 samples per device.
"""

from __future__ import annotations

import random

MODALITIES = [("image", 256, None), ("audio", 300, 128), ("video", 512, None), ("imu", 64, 48)]


def synthetic_spec(devices: int, tasks: int, seed: int = 0, large: bool = False) -> str:
    rng = random.Random(seed)
    lines = [
        "cluster {",
        f"  devices = {devices}",
        f'  device = "{"H100-80GB" if large else "A800-80GB"}"',
        "  devices_per_node = 8",
        "}",
        f"modality text {{ tokens = {1024 if large else 256}  vocab = 32000 }}",
    ]
    for name, tokens, features in MODALITIES:
        extra = f"  features = {features}" if features else ""
        lines.append(f"modality {name} {{ tokens = {tokens}{extra} }}")
    encoders = []
    hiddens = [1024, 1280, 1664, 2048] if large else [512, 768, 1024, 1280]
    depths = [24, 32, 48] if large else [6, 12, 24, 32]
    heads = 16 if large else 8
    for i in range(8):
        mod, _, features = MODALITIES[i % len(MODALITIES)]
        hidden = rng.choice(hiddens)
        layers = rng.choice(depths)
        if features is None:
            lines.append(
                f"encoder enc{i} : vit(layers = {layers}, hidden = {hidden}, heads = {heads}, "
                f"patch = 14) <- {mod}"
            )
        else:
            lines.append(
                f"encoder enc{i} : transformer(layers = {layers}, hidden = {hidden}, "
                f"heads = {heads}) <- {mod}"
            )
        encoders.append((f"enc{i}", mod, hidden))
    llms = (
        [("llm_a", 4096, 32, 32), ("llm_b", 2560, 32, 20)]
        if large
        else [
            ("llm_a", 2048, 32, 16),
            ("llm_b", 1536, 24, 16),
        ]
    )
    for name, width, layers, n_heads in llms:
        lines.append(
            f"shared {name} : transformer(layers = {layers}, hidden = {width}, heads = {n_heads},"
            " causal = true, vocab = 32000)"
        )
    weights = []
    for t in range(tasks):
        llm, width = rng.choice([(name, width) for name, width, _, _ in llms])
        chosen = rng.sample(encoders, rng.choice([1, 1, 2]))
        body = []
        for j, (enc, mod, hidden) in enumerate(chosen):
            lines.append(f"module ad{t}_{j} : mlp(in = {hidden}, out = {width})")
            body.append(f"  {mod} -> {enc} -> ad{t}_{j} -> {llm}")
        body.append(f"  text -> {llm}")
        lines.append(f"task t{t} {{")
        lines.extend(body)
        lines.append("  loss = lm")
        lines.append("}")
        weights.append(f"  t{t} = {rng.randint(1, 5)}")
    lines.append("mix main {")
    lines.append(f"  global_batch = {8 * devices if large else max(256, 16 * devices)}")
    lines.extend(weights)
    lines.append("}")
    return "\n".join(lines) + "\n"
