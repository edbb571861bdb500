"""Fixtures every test folder may use.

``spec_dir`` is the folder of reference specs the suite carries (``tests/fixtures/spec``, see
``tests/specfixtures.py``): the workloads at its top, ``broken/`` and ``next/``. Every test
reads its specs from there, so a clone of the repository on its own runs the whole suite (only
tests that need a GPU, Graphviz or a browser skip where those are missing).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from spindle_dsl.cluster import CORES_ENV

# helpers every test folder imports by name (``benchload``, ``specfixtures``): importlib mode
# adds no folder to the path
HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from specfixtures import SPEC_DIR  # noqa: E402

# Plans for cpu clusters price the machine's cores (``Cluster.shared_cores``); pin a count
# larger than any test cluster so that plans and predictions do not depend on the machine
# running the tests (and its subprocesses, which inherit the environment). Tests of core
# sharing set ``Cluster.cores`` themselves.
os.environ[CORES_ENV] = "1024"


@pytest.fixture(scope="session", autouse=True)
def profile_cache_off(tmp_path_factory: pytest.TempPathFactory):
    """The profile cache (``spindle plan``/``train`` on cpu clusters, ``cli.calibration``)
    in a folder of the session's, never the user's ``~/.cache``, and off: tests that plan or
    train a cpu spec price it with the analytic model, as they were written for, instead of
    profiling the machine first (seconds per spec). The cache's own tests turn it on
    (``monkeypatch.delenv(NO_CACHE_ENV)``) with a folder of their own. Subprocesses inherit
    both settings."""
    from spindle_dsl.cli.calibration import NO_CACHE_ENV
    from spindle_dsl.cost.profile_cache import CACHE_ENV

    saved = {k: os.environ.get(k) for k in (CACHE_ENV, NO_CACHE_ENV)}
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("spindle-cache"))
    os.environ[NO_CACHE_ENV] = "1"
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def spec_dir() -> Path:
    """``tests/fixtures/spec``, the reference specs (``spec_dir / "tiny_mm.spindle"``)."""
    assert (SPEC_DIR / "tiny_mm.spindle").is_file(), f"{SPEC_DIR} lacks its reference specs"
    return SPEC_DIR


# A GPU spec with everything the memory model distinguishes: a shared causal LM with an
# embedding and a head (lm loss), a frozen encoder, an encoder reading features. The cost
# model's memory tests and the planner's memory-fit tests read it at different batches.
MEMORY_SPEC = """
cluster {{ devices = 16  device = "A800-80GB"  devices_per_node = 8 }}
modality image {{ tokens = 64 }}
modality audio {{ tokens = 40  features = 16 }}
modality text  {{ tokens = 32  vocab = 1000 }}
encoder vision : vit(layers = 4, hidden = 128, heads = 4, patch = 4) <- image frozen
encoder hearing : transformer(layers = 3, hidden = 64, heads = 4) <- audio
module  vproj : mlp(in = 128, out = 256)
module  aproj : mlp(in = 64, out = 256)
shared  lm : transformer(layers = 6, hidden = 256, heads = 8, causal = true, vocab = 1000)
task caption {{ image -> vision -> vproj -> lm; text -> lm; loss = lm }}
task listen  {{ audio -> hearing -> aproj -> lm; text[16] -> lm; loss = lm }}
mix m {{ global_batch = {global_batch}; caption = 2; listen = 1 }}
"""


@pytest.fixture(scope="session")
def memory_spec():
    """``memory_spec(global_batch)``: the spec text above at that global batch."""
    return lambda global_batch: MEMORY_SPEC.format(global_batch=global_batch)
