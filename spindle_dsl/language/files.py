"""Files a spec names: pretrained weights (``from "w.safetensors"``) and task data
(``data = "folder"`` or ``data = "package.module:function"``).

Paths are relative to the spec file, as an ``#include`` is to the file that writes it, so a spec
and its data move together; a spec compiled from a string resolves them against the working
directory. The checker only makes sure a named file exists, at the string that names it: what
is inside (tensor names and shapes, array shapes) is the runtime's to check, against the model
it builds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# package.module:function (a dotted module path, one function name)
_REFERENCE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


def is_reference(text: str) -> bool:
    """``package.module:function`` rather than a path."""
    return _REFERENCE.fullmatch(text) is not None


def spec_relative(spec_path: str, text: str) -> str:
    """``text`` as a path: absolute as written, else relative to the spec file's folder (the
    working directory for a spec that is not a file), normalised but with links kept."""
    expanded = os.path.expanduser(text)
    if os.path.isabs(expanded):
        return os.path.normpath(expanded)
    base = Path(spec_path).parent if not spec_path.startswith("<") else Path.cwd()
    return os.path.normpath(os.path.abspath(base / expanded))
