"""Loading a script of ``bench/`` as a module, for the tests of its tables (the scripts are
programs, not a package: each is imported from its file)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as ``bench_<name>`` (once per test session)."""
    key = f"bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module
