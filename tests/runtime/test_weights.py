"""Weights in and out: ``from "w.safetensors"`` on a module, ``spindle export``, and the round
trip train -> export -> load -> export."""

from __future__ import annotations

import re

import pytest
import torch
from runtime_helpers import REPO, checkpoint_state
from safetensors.torch import load_file, save_file

from spindle_dsl.backends.torch import ReferenceModel
from spindle_dsl.backends.torch.export import export_model
from spindle_dsl.backends.torch.params import PartStore
from spindle_dsl.backends.torch.parts import Part
from spindle_dsl.backends.torch.weights import check_weights
from spindle_dsl.cli import main
from spindle_dsl.errors import ExecutionError
from spindle_dsl.language import compile_file

TINY = REPO / "examples" / "tiny_mm.spindle"


def with_from(text: str, file: str, frozen: bool = False, only: str | None = None) -> str:
    """The spec with ``from "file"`` (and ``frozen``) at the end of every module declaration,
    or of module ``only``."""
    suffix = (" frozen" if frozen else "") + f' from "{file}"'
    pattern = r"^((?:encoder|module|shared)\s+(\w+)\s*:.*)$"

    def add(m: re.Match) -> str:
        return m.group(1) + suffix if only in (None, m.group(2)) else m.group(1)

    return re.sub(pattern, add, text, flags=re.M)


@pytest.fixture(scope="module")
def graph():
    return compile_file(TINY).graph


@pytest.fixture(scope="module")
def initial(graph, tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "init.safetensors"
    export_model(graph, path, seed=5)
    return path


def test_initial_export_is_the_seeded_model_and_loads_strictly(graph, initial):
    tensors = load_file(initial)
    ref = ReferenceModel(graph, seed=5)
    want = {f"{k.replace('/', '.')}.{n}": t for k, ps in ref.state().items() for n, t in ps.items()}
    assert tensors.keys() == want.keys()
    assert "lm.head.out.weight" in tensors and "vision.input.image.proj.weight" in tensors
    assert all(torch.equal(tensors[k], want[k]) for k in want)
    other = ReferenceModel(graph, seed=6)
    other.load_weights(str(initial))
    assert all(torch.equal(t, ref.state()[k][n]) for k, ps in other.state().items()
               for n, t in ps.items())  # fmt: skip


def test_strict_loading_lists_missing_extra_and_misshaped_keys(graph, initial, tmp_path):
    tensors = load_file(initial)
    del tensors["lm.layer.3.qkv.weight"]
    tensors["lm.layer.9.qkv.weight"] = torch.zeros(1)
    tensors["vision.layer.0.proj.bias"] = torch.zeros(7)
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, bad)
    with pytest.raises(ExecutionError) as info:
        ReferenceModel(graph).load_weights(str(bad))
    message = str(info.value)
    assert "missing 1 key(s): lm.layer.3.qkv.weight" in message
    assert "1 extra key(s), which no part of this spec has: lm.layer.9.qkv.weight" in message
    assert "vision.layer.0.proj.bias: the file has [7], the model [64]" in message


def test_from_loads_each_module_and_checks_its_keys(graph, initial, tmp_path):
    spec = tmp_path / "s.spindle"
    spec.write_text(with_from(TINY.read_text(), str(initial), only="lm"))
    loaded = compile_file(spec).graph
    assert loaded.module("lm").weights == str(initial)
    ref, seeded = ReferenceModel(loaded, seed=0).state(), ReferenceModel(graph, seed=5).state()
    assert torch.equal(ref["lm/layer.2"]["qkv.weight"], seeded["lm/layer.2"]["qkv.weight"])
    assert torch.equal(ref["lm/head"]["out.weight"], seeded["lm/head"]["out.weight"])
    assert not torch.equal(
        ref["vision/layer.0"]["qkv.weight"], seeded["vision/layer.0"]["qkv.weight"]
    )
    # a file of one module's keys without the prefix works too
    lm_only = {k[3:]: v for k, v in load_file(initial).items() if k.startswith("lm.")}
    save_file(lm_only, tmp_path / "lm.safetensors")
    spec.write_text(with_from(TINY.read_text(), "lm.safetensors", only="lm"))
    again = ReferenceModel(compile_file(spec).graph).state()
    assert torch.equal(
        again["lm/layer.5"]["ffn.fc2.weight"], seeded["lm/layer.5"]["ffn.fc2.weight"]
    )
    # mis-shaped and missing keys of that module are listed before anything trains
    lm_only["layer.0.proj.weight"] = torch.zeros(3, 3)
    del lm_only["head.ln.bias"]
    lm_only["layer.7.ln1.weight"] = torch.zeros(96)
    save_file(lm_only, tmp_path / "lm.safetensors")
    with pytest.raises(ExecutionError) as info:
        check_weights(compile_file(spec).graph, ReferenceModel(graph).store.parts)
    message = str(info.value)
    assert f"module lm from {tmp_path / 'lm.safetensors'}" in message
    assert "missing 1 key(s): head.ln.bias" in message
    assert "extra key(s), which no part of this spec has: layer.7.ln1.weight" in message
    assert "layer.0.proj.weight: the file has [3, 3], the model [96, 96]" in message


def test_a_rank_reads_only_the_parts_it_holds(graph, initial, tmp_path):
    partial = {k: v for k, v in load_file(initial).items() if not k.startswith("lm.layer.4.")}
    save_file(partial, tmp_path / "partial.safetensors")
    spec = tmp_path / "s.spindle"
    spec.write_text(with_from(TINY.read_text(), "partial.safetensors", only="lm"))
    g = compile_file(spec).graph
    store = PartStore(g, [Part("lm", "layer.0"), Part("lm", "head")], seed=0)
    assert torch.equal(store[Part("lm", "layer.0")].qkv.weight, partial["lm.layer.0.qkv.weight"])
    with pytest.raises(ExecutionError, match=r"(?s)weights of lm/layer.4 in .*missing 12 key\(s\)"):
        PartStore(g, [Part("lm", "layer.4")], seed=0)


def test_export_and_its_errors_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    assert main(["export", str(TINY), "-o", str(out), "--dtype", "float64"]) == 0
    assert "159 tensors, 1,044,432 parameters (initial weights)" in capsys.readouterr().out
    assert load_file(out)["lm.head.out.weight"].dtype == torch.float64
    assert main(["export", str(TINY), "-o", str(out), "--checkpoint-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "holds no checkpoint" in err and "Traceback" not in err


@pytest.mark.slow
def test_train_export_load_export_round_trip(initial, tmp_path, capfd):
    # train a spec whose vision tower is frozen and loaded from a file: the workers load the
    # parts they hold, the tower stays as loaded, the rest trains
    ckpt, a, b = tmp_path / "C", tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    spec = tmp_path / "tower.spindle"
    spec.write_text(with_from(TINY.read_text(), str(initial), frozen=True, only="vision"))
    code = main(["train", str(spec), "--nproc", "2", "--steps", "2", "--no-progress",
                 "--checkpoint-dir", str(ckpt), "--scheduler", "paper"])  # fmt: skip
    assert code == 0, capfd.readouterr().err
    assert main(["export", str(spec), "--checkpoint-dir", str(ckpt), "-o", str(a)]) == 0
    assert "(checkpoint step 2" in capfd.readouterr().out
    first, init = load_file(a), load_file(initial)
    assert torch.equal(first["vision.layer.3.qkv.weight"], init["vision.layer.3.qkv.weight"])
    assert not torch.equal(first["lm.layer.0.qkv.weight"], init["lm.layer.0.qkv.weight"])
    # the export holds exactly the trained parameters, and loads strictly into the oracle
    trained = checkpoint_state(ckpt)
    ref = ReferenceModel(compile_file(TINY).graph)
    ref.load_weights(str(a))
    for key, params in ref.state().items():
        for name, t in params.items():
            assert torch.equal(t, trained[key][name]), f"{key}:{name}"
    # every module from a.safetensors, exported without a checkpoint: the same tensors
    again = tmp_path / "from_a.spindle"
    again.write_text(with_from(TINY.read_text(), "a.safetensors"))
    assert main(["export", str(again), "-o", str(b)]) == 0
    second = load_file(b)
    assert first.keys() == second.keys()
    for k in first:
        assert first[k].dtype == second[k].dtype and torch.equal(first[k], second[k]), k
