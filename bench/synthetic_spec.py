"""A generator of large multi-task specs for planning-time sweeps (up to 65,536 devices, 50 tasks).

Tasks route one or two modality encoders through a per-task adapter into one of two shared
language models, the shape of the paper's workloads scaled out. Sizes are drawn from a fixed
seed so every run plans the same spec.
"""

from __future__ import annotations

import random

MODALITIES = [("image", 256, None), ("audio", 300, 128), ("video", 512, None), ("imu", 64, 48)]


def synthetic_spec(devices: int, tasks: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines = [
        "cluster {",
        f"  devices = {devices}",
        '  device = "A800-80GB"',
        "  devices_per_node = 8",
        "}",
        "modality text { tokens = 256  vocab = 32000 }",
    ]
    for name, tokens, features in MODALITIES:
        extra = f"  features = {features}" if features else ""
        lines.append(f"modality {name} {{ tokens = {tokens}{extra} }}")
    encoders = []
    for i in range(8):
        mod, _, features = MODALITIES[i % len(MODALITIES)]
        hidden = rng.choice([512, 768, 1024, 1280])
        layers = rng.choice([6, 12, 24, 32])
        if features is None:
            lines.append(
                f"encoder enc{i} : vit(layers = {layers}, hidden = {hidden}, heads = 8, "
                f"patch = 14) <- {mod}"
            )
        else:
            lines.append(
                f"encoder enc{i} : transformer(layers = {layers}, hidden = {hidden}, "
                f"heads = 8) <- {mod}"
            )
        encoders.append((f"enc{i}", mod, hidden))
    lines.append(
        "shared llm_a : transformer(layers = 32, hidden = 2048, heads = 16, causal = true, "
        "vocab = 32000)"
    )
    lines.append(
        "shared llm_b : transformer(layers = 24, hidden = 1536, heads = 16, causal = true, "
        "vocab = 32000)"
    )
    weights = []
    for t in range(tasks):
        llm, width = rng.choice([("llm_a", 2048), ("llm_b", 1536)])
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
    lines.append(f"  global_batch = {max(256, 16 * devices)}")
    lines.extend(weights)
    lines.append("}")
    return "\n".join(lines) + "\n"
