"""``spindle_dsl.grammar`` and ``spindle_dsl.backends`` when the package is imported from a
checkout rather than from an installation.

The design card keeps ``grammar/`` and ``backends/`` at the top of the repository; setup.py maps
them into the package when it is installed (and an editable install's finder does the same).
But ``python -m spindle_dsl`` run from the repository's root (as ``torchrun -m spindle_dsl``
is) imports the source folder ``spindle_dsl/`` directly, ahead of any installation, and that
folder has neither inside. This finder answers for exactly those two names, from the folders
beside the package, and only where the package folder lacks them: an installed package, or an
editable install's own finder, is never overridden.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_MAPPED = ("grammar", "backends")


class _CheckoutFinder(MetaPathFinder):
    def __init__(self, folders: dict[str, Path]):
        self.folders = folders

    def find_spec(self, fullname, path=None, target=None) -> ModuleSpec | None:
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def map_checkout_folders() -> None:
    """Install the finder if this package is a checkout's source folder (see above)."""
    folders = {
        f"spindle_dsl.{name}": _HERE.parent / name
        for name in _MAPPED
        if not (_HERE / name).exists() and (_HERE.parent / name / "__init__.py").is_file()
    }
    if folders and not any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
        sys.meta_path.append(_CheckoutFinder(folders))
