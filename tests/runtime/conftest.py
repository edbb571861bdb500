"""Make the test doubles beside this file importable (tests use importlib mode), and run each
runtime test's in-process torch work on one thread, as the worker processes do: the models here
are tiny, and on a shared machine extra threads only make them wait (a float64 tiny_mm step in
one process measured 0.3-0.6 s on one thread and 1.8-6 s on two, the 2 cores being busy)."""

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_rank():
    """A one-rank gloo group in this process (a Trainer sums its losses over the ranks)."""
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def tiny_mm_graph(spec_dir):
    """The reference tiny_mm spec's MetaGraph (4 CPU devices)."""
    from spindle_dsl.language import compile_file

    return compile_file(spec_dir / "tiny_mm.spindle").graph


@pytest.fixture(scope="module")
def tiny_mm_oracle(tiny_mm_graph, request):
    """The single-process float64 oracle trained for the module's ``STEPS``: its losses per
    step and its final state."""
    from spindle_dsl.backends.torch import ReferenceModel

    ref = ReferenceModel(tiny_mm_graph, dtype="float64")
    return ref.train(request.module.STEPS), ref.state()
