"""Property: whatever numbers and tokens of a fixture are mutated into, compiling and planning
ends in a plan or a ``SpindleError``, never another exception, and never hangs.

The mutations are ``bench/fuzz.py``'s (numbers set to 0, 1, -1, 2, 3, 7, 65536, 1000000,
99999999999, 0.5 or 1e9, the values at and past the language's bounds; tokens deleted,
duplicated or swapped), on every fixture: the suite's reference specs (``tests/fixtures/spec``
with ``next/``, plus any spec a shared folder beside the checkout adds), ``examples/``,
``bench/specs/`` and a generated spec. Here a short MILP time limit keeps the suite quick;
``bench/fuzz.py --minutes 6`` runs the same with the planner's defaults.
"""

from __future__ import annotations

import importlib.util
import random
import signal
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specfixtures import SPEC_DIR, extra_shared_specs

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_fuzz", REPO / "bench" / "fuzz.py")
fuzz = importlib.util.module_from_spec(_spec)
sys.modules["bench_fuzz"] = fuzz  # its dataclasses look their module up
_spec.loader.exec_module(fuzz)

HANG_S = 120  # far beyond any case's planning time: only a hang gets here


def _corpus() -> dict[str, str]:
    """``bench/fuzz.py``'s seeds with the suite's reference specs in place of the shared
    folder's (the bench reads ``../shared/spec``; a clone on its own has none)."""
    fuzz.SHARED = SPEC_DIR
    seeds = fuzz.seeds([])
    seeds.pop("synthetic 1024x50")  # seconds per case: the bench fuzzes it
    for sub in ("", "next"):
        for path in extra_shared_specs(sub):
            seeds[f"shared/{sub + '/' if sub else ''}{path.name}"] = path.read_text()
    assert "spec/tiny_mm.spindle" in seeds and "next/llama2_7b.spindle" in seeds, sorted(seeds)
    return seeds


CORPUS = _corpus()


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer within {HANG_S} s")


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(name=st.sampled_from(sorted(CORPUS)), seed=st.integers(0, 2**32 - 1))
def test_mutated_fixtures_compile_and_plan_or_say_why(name, seed):
    text, done = fuzz.mutate(CORPUS[name], random.Random(seed))
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    try:
        status, detail = fuzz.run_case(text, time_limit_s=0.2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert status != "traceback", f"{name} after {done}:\n{detail}"


def test_the_mutations_set_numbers_and_move_tokens():
    """``fuzz.mutate`` sets numbers (a size keeping its unit) and deletes, duplicates and swaps
    tokens, and changes nothing when asked for no mutation."""
    rng = random.Random(0)
    text = "cluster { devices = 32; memory = 80GB }\n"
    seen = set()
    for _ in range(300):
        out, done = fuzz.mutate(text, rng, count=1)
        seen.add(done[0].split(":", 1)[1].split()[0])
        if "-> " in done[0]:
            assert out.count("GB") == 1  # a size keeps its unit
    assert {"32", "80GB", "delete", "duplicate", "swap"} <= seen
    assert fuzz.mutate(text, rng, count=0)[0] == text
