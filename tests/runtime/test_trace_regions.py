"""The runtime's measured spans are named regions in ``torch.profiler`` traces, and on a CUDA
device a span holds the GPU work it launched, not only the launches."""

from __future__ import annotations

import time

import pytest
import torch

from spindle_dsl.backends.torch.trace import Tracer


def test_spans_are_profiler_regions_on_cpu():
    tracer = Tracer(0, enabled=True, device=torch.device("cpu"))
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof, tracer.span("F caption/lm#0", "forward"):
        torch.ones(64, 64) @ torch.ones(64, 64)
    names = {e.name for e in prof.events()}
    assert "forward:F caption/lm#0" in names, sorted(names)[:20]
    assert [s.name for s in tracer.spans] == ["F caption/lm#0"]


def test_a_disabled_tracer_records_nothing():
    tracer = Tracer(0, enabled=False, device=torch.device("cpu"))
    with tracer.span("F", "forward"):
        pass
    assert tracer.spans == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_span_holds_its_kernels():
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    torch.cuda.synchronize()
    tracer = Tracer(0, enabled=True, device=device)
    with tracer.span("matmuls", "forward"):
        for _ in range(20):
            a = a @ a / 64.0
    span = tracer.spans[0]
    # the launches alone return at once; with the device waited for, the span is the work
    t0 = time.time()
    torch.cuda.synchronize()
    assert span.end - span.start > 10 * (time.time() - t0)
