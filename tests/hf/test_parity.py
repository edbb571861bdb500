"""Parity with transformers for every supported architecture (tiny configs: hidden 32, two
layers). The project's forward from a Hugging Face folder equals transformers' forward (logits,
last hidden state or pooled output) to 1e-5 in float32; the exported folder loads in
transformers with no missing or unexpected keys and computes the same; and exporting then
importing again gives bit-identical tensors. The last tests flip one convention each (the
rotary layout, the gate/up order, the grouping of query heads per K/V head) and find the
outputs apart, so these comparisons can fail."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="transformers is in the dev extra")

import torch
from parity import CASES, Case, inputs, ours, spec, state, theirs
from tiny_models import CLASSES, save

from spindle_dsl.backends.torch.export import initial_tensors
from spindle_dsl.hf.export import export_folders
from spindle_dsl.language import compile_text

IDS = [f"{c.name}-{c.output}" for c in CASES]


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_equals_transformers(tmp_path, case: Case) -> None:
    model = save(case.name, tmp_path / case.name)
    given, raw = inputs(case)
    mine, reference = ours(case, tmp_path / case.name, raw), theirs(case, model, given)
    assert mine.shape == reference.shape
    assert (mine - reference).abs().max() <= 1e-5 * max(1.0, reference.abs().max())


@pytest.mark.parametrize("case", [c for c in CASES if c.output != "pooler_output"], ids=str)
def test_export_loads_in_transformers_and_reimports_bit_identical(tmp_path, case: Case) -> None:
    save(case.name, tmp_path / case.name)
    graph = compile_text(spec(case, tmp_path / case.name), str(tmp_path / "job.spindle")).graph
    (done,) = export_folders(graph, tmp_path / "out", initial_tensors(graph), module="m")
    assert done.model_type is not None, done.note
    model, info = CLASSES[case.name].from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    given, raw = inputs(case)
    assert close(theirs(case, model.eval(), given), ours(case, tmp_path / case.name, raw))
    again = compile_text(spec(case, tmp_path / "out"), str(tmp_path / "job.spindle")).graph
    before, after = state(graph), state(again)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


LLAMA = next(c for c in CASES if c.name == "llama")


def _flipped_gate_up(monkeypatch) -> None:
    from spindle_dsl.hf import llama

    swapped = llama.BLOCK.__class__(**{**vars(llama.BLOCK), "up": llama.BLOCK.up[::-1]})
    monkeypatch.setattr(llama.Llama, "block", swapped)


def _interleaved_rotary(monkeypatch) -> None:
    from spindle_dsl.kinds import layers

    def rotate_pairs(x, theta, scaling=None):  # GPT-J's layout: rotate (0, 1), (2, 3), ...
        pairs = x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)
        turned = rotate_halves(pairs, theta, scaling)
        return turned.unflatten(-1, (2, -1)).transpose(-1, -2).flatten(-2)

    rotate_halves = layers.rotate
    monkeypatch.setattr(layers, "rotate", rotate_pairs)


def _strided_groups(monkeypatch) -> None:
    from spindle_dsl.kinds import layers

    real = torch.nn.functional.scaled_dot_product_attention

    def attention(q, k, v, causal, mask=None):  # query head i reads K/V head i % kv_heads
        assert mask is None, "these inputs have no padding"
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1)
        return real(q, k, v, is_causal=causal)

    monkeypatch.setattr(layers, "attention", attention)


@pytest.mark.parametrize("flip", [_flipped_gate_up, _interleaved_rotary, _strided_groups])
def test_a_flipped_convention_is_caught(tmp_path, monkeypatch, flip) -> None:
    model = save("llama", tmp_path / "llama")
    given, raw = inputs(LLAMA)
    assert close(ours(LLAMA, tmp_path / "llama", raw), theirs(LLAMA, model, given))
    flip(monkeypatch)
    assert not close(ours(LLAMA, tmp_path / "llama", raw), theirs(LLAMA, model, given))
