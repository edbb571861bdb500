"""The worker's malloc settings: freed activation-sized blocks are reused, not re-faulted."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Ten "steps", each allocating 24 blocks of 256 KiB to 3.25 MiB (about 40 MiB live at once)
# and freeing them, as a step's activations and gradients are; prints the minor page faults.
_PROBE = textwrap.dedent(
    """
    import resource, sys, torch
    if sys.argv[1] == "kept":
        from spindle_dsl.backends.torch.allocator import keep_freed_host_memory
        assert keep_freed_host_memory()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for step in range(10):
        blocks = [torch.ones(64 * 1024 * (1 + (j * 7 + step) % 13)) for j in range(24)]
        del blocks
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_blocks_are_reused_without_page_faults():
    # glibc's defaults hand the freed top of the heap back to the system and map it again
    # in the next steps (measured: ~21,000 faults); kept, the first step maps what the later
    # ones reuse (~11,300: one step's worth)
    default, kept = _faults("default"), _faults("kept")
    assert kept < 0.75 * default, (kept, default)
