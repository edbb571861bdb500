"""Where the suite's reference specs live, for tests that need them at collection time.

``tests/fixtures/spec`` holds the reference workloads the suite plans and trains
(``*.spindle``), the bad specs whose first line says the error each must produce
(``broken/``), and specs in syntax the language may not accept yet (``next/``). The suite
carries them so that any clone of the repository runs every test; the ``spec_dir`` fixture
(``tests/conftest.py``) hands the same folder to a test.

A developer's checkout may have a shared folder beside it (``../shared/spec``) with more
specs of the same kinds. Those only add cases (``extra_shared_specs``): nothing needs them.
"""

from __future__ import annotations

from pathlib import Path

SPEC_DIR = Path(__file__).resolve().parent / "fixtures" / "spec"
SHARED_SPEC_DIR = Path(__file__).resolve().parents[2] / "shared" / "spec"


def extra_shared_specs(sub: str = "") -> list[Path]:
    """The ``../shared/spec/<sub>/*.spindle`` files whose name the suite's copy lacks, sorted
    (none when there is no shared folder)."""
    ours = {p.name for p in (SPEC_DIR / sub).glob("*.spindle")}
    return sorted(p for p in (SHARED_SPEC_DIR / sub).glob("*.spindle") if p.name not in ours)
