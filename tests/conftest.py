"""Fixtures every test folder may use.

``shared_dir`` is the project's shared folder (``../shared`` beside the repository) with the
spec fixtures and docs. A checkout without it (a release tarball, a fork) must still pass its
tests, so the fixture skips the test instead of failing it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = (REPO / ".." / "shared").resolve()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared``; skips the test when it is absent."""
    if not (SHARED / "spec").is_dir():
        pytest.skip(f"{SHARED} is absent (the shared spec fixtures live there)")
    return SHARED
