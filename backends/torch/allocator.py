"""Host memory a training process frees stays in the process, for the next step to reuse.

glibc's malloc serves large blocks (above 128 KiB at first) with fresh ``mmap`` pages and
returns the freed top of the heap to the system; a CPU training step frees and allocates the
same activations and gradients every step, so each step pays the kernel to map and zero those
pages again (``/usr/bin/time`` over two runs of `spindle train` that differ only in their
step count shows the minor page faults each step adds, and how few are left with the blocks
kept). The profile's tight loops reuse their blocks and never see this cost, so the run would
pay what the plan does not price. Raising the mmap threshold to its ceiling and keeping freed
memory (no trimming) makes the run allocate as the profile measured. Peak memory stays the
same: the process keeps what it freed for reuse, it does not hold more at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt(3) parameters (malloc.h) and the values set.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20  # the ceiling glibc accepts on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD_BYTES = 2**30
TOP_PAD_BYTES = 64 * 2**20


def keep_freed_host_memory() -> bool:
    """Tell glibc's malloc to keep freed blocks for reuse; True where it took the settings
    (False on other C libraries or systems, where nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        (_M_TOP_PAD, TOP_PAD_BYTES),
    )
    return all(mallopt(param, value) == 1 for param, value in settings)
