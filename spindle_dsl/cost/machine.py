"""What makes two profiles of CPU workers comparable: the machine key of the profile cache.

Timings taken on one machine price a run on it only if the run's workers meet the same
conditions: the same CPU model, as many cores to share, the same torch (its kernels), the same
thread setting per worker process and the same number of worker processes (the collectives,
and how the workers crowd the cores, depend on it). ``MachineKey.here(ranks)`` reads these off
this machine; two keys that are equal name one cache file (``file_name``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spindle_dsl.cluster import usable_cores

CPUINFO = Path("/proc/cpuinfo")
# the lines of /proc/cpuinfo that name the processor, in order of preference (x86 has the
# first; some ARM kernels give only the others)
_MODEL_FIELDS = ("model name", "Hardware", "Processor", "cpu model")


@dataclass(frozen=True)
class MachineKey:
    """The conditions a profile of CPU workers holds for (see the module docstring)."""

    cpu: str  # the processor's model name
    cores: int  # cores the workers share (``cluster.usable_cores``)
    torch: str  # torch's version
    threads: int  # torch threads per worker process (OMP_NUM_THREADS, as the launcher sets)
    ranks: int  # worker processes measured on

    @classmethod
    def here(cls, ranks: int) -> MachineKey:
        """This machine's key for a run on ``ranks`` worker processes."""
        return cls(cpu_model(), usable_cores(), torch_version(), worker_threads(), ranks)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> MachineKey:
        """Raises KeyError, TypeError or ValueError on a malformed dict (callers wrap them)."""
        return cls(str(d["cpu"]), int(d["cores"]), str(d["torch"]), int(d["threads"]),
                   int(d["ranks"]))  # fmt: skip

    def file_name(self) -> str:
        """A readable name that differs for every key: the key's fields, made safe for a file
        name, then a short digest of the whole key (two CPU names may read alike once
        simplified)."""
        digest = hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()
        name = (
            f"{_slug(self.cpu)}-{self.cores}cores-torch{_slug(self.torch)}-"
            f"{self.threads}thread-{self.ranks}ranks"
        )
        return f"{name}-{digest[:10]}.json"


def _slug(text: str) -> str:
    """``Intel(R) Xeon(R) CPU @ 2.9GHz`` -> ``intel-r-xeon-r-cpu-2.9ghz`` (at most 48 chars)."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")[:48] or "unknown"


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The processor's model name: from /proc/cpuinfo where the system has it, else what
    ``platform`` says (the processor, else the architecture)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for field in _MODEL_FIELDS:
        match = re.search(rf"^{re.escape(field)}\s*:\s*(.+?)\s*$", text, re.MULTILINE)
        if match and match.group(1):
            return match.group(1)
    return platform.processor() or platform.machine() or "unknown"


def torch_version() -> str:
    """torch's version, read from its installed metadata (importing torch takes seconds)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        import torch

        return str(torch.__version__)


def worker_threads() -> int:
    """The torch threads a spawned worker sets (``launch``: OMP_NUM_THREADS, else 1)."""
    text = os.environ.get("OMP_NUM_THREADS", "1").strip()
    return int(text) if text.isdigit() and int(text) >= 1 else 1
