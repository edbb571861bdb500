"""Training data from files: the ``.npy`` folder format, ``package.module:function`` sources,
``data = "..."`` in a spec, ``spindle data synth`` and ``spindle train --data``."""

from __future__ import annotations

import json
import pickle
import textwrap

import handgraph as h
import numpy as np
import pytest
import torch

from spindle_dsl.backends.torch import ReferenceModel
from spindle_dsl.backends.torch.data import SyntheticSource, TaskData, synthesize
from spindle_dsl.backends.torch.datafiles import NpyFolder, patchify, write_task_folder
from spindle_dsl.cli import main
from spindle_dsl.cli.cmd_data import bind_data
from spindle_dsl.errors import ExecutionError
from spindle_dsl.language import compile_text


def _same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def tiny():
    return h.tiny_mm(2)


@pytest.fixture
def folders(tiny, tmp_path):
    return synthesize(tiny, tmp_path / "D", 40)


def test_synth_folders_read_back_as_the_synthetic_source(tiny, folders):
    synthetic = TaskData(tiny, 0, dtype=torch.float64)
    files = TaskData(tiny, 0, {t: str(p) for t, p in folders.items()}, dtype=torch.float64)
    assert sorted(p.name for p in folders["caption"].glob("*.npy")) == ["image.npy", "text.npy"]
    assert np.load(folders["caption"] / "text.npy").dtype == np.int64
    assert np.load(folders["caption"] / "image.npy").shape == (40, 16, 48)
    for task, batch in (("caption", 24), ("transcribe", 8)):
        _same(synthetic.rows(task, 0, 0, batch), files.rows(task, 0, 0, batch))
        _same(synthetic.rows_at(task, 13, 2, 9), files.rows_at(task, 13, 2, 9))
    # past the 40 rows the folder wraps around, the synthetic source does not
    wrapped = files.rows_at("caption", 40, 0, 3)
    _same(wrapped, files.rows_at("caption", 0, 0, 3))


def test_rows_follow_global_positions_not_steps(tiny):
    data = TaskData(tiny, 3)
    source = SyntheticSource(tiny, "caption", 3)
    rows = data.rows_at("caption", 50, 1, 4)  # rows 1..3 of a batch starting at sample 50
    for i, row in enumerate(range(51, 54)):
        assert torch.equal(rows["text"][i], source[row]["text"])
    _same(data.rows("caption", 2, 0, 24), data.rows_at("caption", 48, 0, 24))


def test_a_folder_pickles_without_its_memory_maps(tiny, folders):
    needs = TaskData(tiny, 0).needs["caption"]
    folder = NpyFolder(folders["caption"], "caption", needs)
    before = folder.take([3, 1])
    clone = pickle.loads(pickle.dumps(folder))
    assert clone._arrays is None
    _same(before, clone.take([3, 1]))
    assert len(clone) == 40 and set(clone[5]) == {"image", "text"}


def test_images_may_be_given_as_pixels(tiny, tmp_path):
    g = np.random.default_rng(0)
    pixels = g.standard_normal((6, 3, 16, 16)).astype(np.float32)
    text = g.integers(0, 512, (6, 12))
    write_task_folder(tmp_path / "px", {"image": pixels, "text": text})
    write_task_folder(tmp_path / "pt", {"image": patchify(pixels, 4), "text": text})
    a = TaskData(tiny, 0, {"caption": str(tmp_path / "px")}).rows_at("caption", 0, 0, 6)
    b = TaskData(tiny, 0, {"caption": str(tmp_path / "pt")}).rows_at("caption", 0, 0, 6)
    _same(a, b)
    # tile (1, 2) of image 0, channel-first: the patch a vit's input stage reads
    assert torch.equal(
        a["image"][0, 1 * 4 + 2], torch.from_numpy(pixels[0, :, 4:8, 8:12]).flatten()
    )


@pytest.mark.parametrize(
    ("arrays", "words"),
    [
        (
            {"image": np.zeros((4, 16, 47), np.float32), "text": np.zeros((4, 12), np.int64)},
            ["image.npy, modality image", "expected (N, >=16, 48)", "found shape (4, 16, 47)"],
        ),
        (
            {"image": np.zeros((4, 16, 48), np.uint8), "text": np.zeros((4, 12), np.int64)},
            ["modality image", "dtype uint8", "astype('float32') / 255"],
        ),
        (
            {"image": np.zeros((4, 16, 48), np.float32), "text": np.zeros((4, 12), np.float32)},
            ["text.npy, modality text", "token ids must be integers"],
        ),
        (
            {"image": np.zeros((4, 16, 48), np.float32), "text": np.zeros((4, 11), np.int64)},
            ["expected (N, >=12) integer token ids", "found shape (4, 11)"],
        ),
        (
            {"image": np.zeros((4, 3, 12, 12), np.float32), "text": np.zeros((4, 12), np.int64)},
            ["at least 16 4x4 patches", "found shape (4, 3, 12, 12)"],
        ),
        (
            {"image": np.zeros((4, 16, 48), np.float32), "text": np.zeros((5, 12), np.int64)},
            ["differ in their number of samples", "image.npy has 4", "text.npy has 5"],
        ),
        (
            {"imgae": np.zeros((4, 16, 48), np.float32), "text": np.zeros((4, 12), np.int64)},
            ["image.npy is missing", "the folder has: imgae.npy, text.npy"],
        ),
    ],
)
def test_bad_arrays_are_named_with_file_modality_and_shapes(tiny, tmp_path, arrays, words):
    write_task_folder(tmp_path / "c", arrays)
    with pytest.raises(ExecutionError) as info:
        TaskData(tiny, 0, {"caption": str(tmp_path / "c")})
    message = str(info.value)
    assert "data of task caption" in message
    for w in words:
        assert w in message, message


def test_token_ids_out_of_range_are_named_when_read(tiny, tmp_path):
    text = np.zeros((4, 12), np.int64)
    text[2, 5] = 512
    write_task_folder(tmp_path / "c", {"image": np.zeros((4, 16, 48), np.float32), "text": text})
    data = TaskData(tiny, 0, {"caption": str(tmp_path / "c")})
    data.rows_at("caption", 0, 0, 2)
    with pytest.raises(
        ExecutionError, match=r"text.npy, sample 2: token ids must lie in \[0, 512\)"
    ):
        data.rows_at("caption", 0, 0, 4)


def test_a_missing_folder_is_named(tiny, tmp_path):
    with pytest.raises(ExecutionError, match="does not exist"):
        TaskData(tiny, 0, {"caption": str(tmp_path / "nope")})


def test_mse_targets_are_written_and_read(tmp_path):
    graph = compile_text(
        textwrap.dedent(
            """
            cluster { devices = 1; device = "cpu" }
            modality imu { tokens = 5; features = 6 }
            encoder enc : transformer(layers = 1, hidden = 8, heads = 2) <- imu
            task regress { imu -> enc; loss = mse; batch = 3 }
            """
        )
    ).graph
    folders = synthesize(graph, tmp_path, 7)
    assert sorted(p.name for p in folders["regress"].glob("*.npy")) == ["imu.npy", "target.npy"]
    assert np.load(folders["regress"] / "target.npy").shape == (7, 5, 8)
    a = TaskData(graph, 0).rows_at("regress", 2, 0, 3)
    b = TaskData(graph, 0, {"regress": str(folders["regress"])}).rows_at("regress", 2, 0, 3)
    _same(a, b)


def test_a_package_function_names_a_dataset(tiny, tmp_path, monkeypatch):
    (tmp_path / "my_digits.py").write_text(
        textwrap.dedent(
            """
            import torch
            from spindle_dsl.backends.torch import DictDataset

            def make():
                n = 5
                return DictDataset(image=torch.ones(n, 16, 48),
                                   text=torch.arange(n * 12).reshape(n, 12) % 512)

            def broken():
                return 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = TaskData(tiny, 0, {"caption": "my_digits:make"})
    rows = data.rows_at("caption", 6, 0, 2)
    assert torch.equal(rows["text"][0], torch.arange(12, 24))  # sample 6 mod 5 = 1
    source = pickle.loads(pickle.dumps(data.sources["caption"]))
    assert source._dataset is None and len(source) == 5
    with pytest.raises(ExecutionError, match="cannot import no_such_module"):
        TaskData(tiny, 0, {"caption": "no_such_module:make"})
    with pytest.raises(ExecutionError, match="has no function nope"):
        TaskData(tiny, 0, {"caption": "my_digits:nope"})
    with pytest.raises(ExecutionError, match=r"my_digits:broken\(\) returned int, not a dataset"):
        TaskData(tiny, 0, {"caption": "my_digits:broken"})


SPEC = """
cluster { devices = 1; device = "cpu" }
modality text { tokens = 6; vocab = 20 }
shared lm : transformer(layers = 1, hidden = 8, heads = 2, causal = true, vocab = 20)
task chat { text -> lm; batch = 2; data = "chat" }
"""


def test_the_spec_names_the_data_and_the_reference_model_reads_it(tmp_path):
    ids = (np.arange(4 * 6).reshape(4, 6) * 7) % 20
    write_task_folder(tmp_path / "chat", {"text": ids})
    spec = tmp_path / "s.spindle"
    spec.write_text(SPEC)
    from spindle_dsl.language import compile_file

    graph = compile_file(spec).graph
    assert graph.task("chat").data == str(tmp_path / "chat")
    ref = ReferenceModel(graph)
    assert torch.equal(ref.data.rows("chat", 1, 0, 2)["text"], torch.from_numpy(ids[2:4]))
    # a bound source overrides the spec's
    other = tmp_path / "other"
    write_task_folder(other, {"text": ids[::-1].copy()})
    bound = TaskData(graph, 0, {"chat": str(other)})
    assert torch.equal(bound.rows("chat", 0, 0, 1)["text"][0], torch.from_numpy(ids[3]))


def test_data_flags_bind_folders_and_tasks(tiny, folders, tmp_path, capsys):
    root = folders["caption"].parent
    assert bind_data([str(root)], tiny) == {t: str(p) for t, p in folders.items()}
    mixed = bind_data([str(root), f"caption={tmp_path}/x", "transcribe=pkg.mod:fn"], tiny)
    assert mixed == {"caption": f"{tmp_path}/x", "transcribe": "pkg.mod:fn"}
    (root / "captoin").mkdir()
    bind_data([str(root)], tiny)
    assert "captoin match no task" in capsys.readouterr().err
    with pytest.raises(ExecutionError, match="has no task nope"):
        bind_data(["nope=x"], tiny)
    with pytest.raises(ExecutionError, match="not a folder"):
        bind_data([str(tmp_path / "missing")], tiny)
    with pytest.raises(ExecutionError, match="no sub-folder named after a task"):
        bind_data([str(folders["caption"])], tiny)


@pytest.mark.slow
def test_train_on_synth_files_gives_the_synthetic_losses(tmp_path, spec_dir, capfd):
    spec = str(spec_dir / "tiny_mm.spindle")
    data = tmp_path / "D"
    assert main(["data", "synth", spec, "--samples", "256", "--out", str(data)]) == 0
    out = capfd.readouterr().out
    assert "caption: 256 samples" in out and "transcribe: 256 samples" in out
    logs = []
    for extra in ([], ["--data", str(data)]):
        log = tmp_path / f"log{len(logs)}.jsonl"
        code = main(["train", spec, "--nproc", "2", "--steps", "3", "--no-progress",
                     "--scheduler", "paper", "--log-json", str(log), *extra])  # fmt: skip
        err = capfd.readouterr().err
        assert code == 0, err
        logs.append([json.loads(x)["loss"] for x in log.read_text().splitlines()])
    assert f"caption <- {data / 'caption'} (256 samples)" in err
    assert len(logs[0]) == 3 and logs[0] == logs[1]
