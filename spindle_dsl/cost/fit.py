"""Fitting the paper's piecewise alpha-beta model to measured layer times.

Spindle models a MetaOp on n devices as ``T(n) = alpha_i + beta_i * c + beta'_i * w / n`` on
each segment i of n, with w the work and c the communication volume. A profile measures one
device, so it pins the compute part: for per-device work ``x = w / n`` (FLOPs) the time is
``alpha_i + beta'_i * x`` on segment i of x. Segments matter because small work runs at lower
efficiency (fixed overheads dominate, kernels are too small) than large work. The
communication part ``beta_i * c`` is priced from the cluster's links (see ``comm``).

The fit minimises relative squared error (times span orders of magnitude), keeps both
coefficients non-negative, and adds a segment only when it halves the error.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """``seconds = alpha_s + beta_s_per_flop * flops`` for work in [from_flops, to_flops)."""

    from_flops: float
    to_flops: float
    alpha_s: float
    beta_s_per_flop: float

    def predict(self, flops: float) -> float:
        return self.alpha_s + self.beta_s_per_flop * flops


@dataclass(frozen=True)
class PiecewiseFit:
    """Segments in increasing order of work; ends extrapolate with the nearest segment.

    A prediction never falls as the work grows: each segment is a line with non-negative
    slope, but a later segment fitted to noisy timings may start below where the one before
    it ends, and a layer never runs faster on more samples. Taking the largest value of the
    segments up to ``flops`` keeps T(n) non-increasing in n, so the cost model's time on n
    devices is the time at the shard the runtime really runs there (``cost.profile``)."""

    segments: tuple[Segment, ...]

    def predict(self, flops: float) -> float:
        floor = 0.0  # where the segments before this one ended
        for seg in self.segments:
            if flops < seg.to_flops:
                return max(seg.predict(flops), floor)
            floor = max(floor, seg.predict(seg.to_flops))
        return max(self.segments[-1].predict(flops), floor)


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``t = a + b x`` through ``(x, t)`` points by relative least squares, ``a, b >= 0``: the
    alpha-beta model of a collective (x in bytes) or a per-sample cost (x in samples)."""
    pts = [(float(x), float(t)) for x, t in points if t > 0]
    if not pts:
        raise ValueError("no positive timings to fit")
    a, b, _ = _fit_line(pts)
    return a, b


def _fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """Weighted (1/t^2) least squares for t = a + b x with a, b >= 0; returns (a, b, error)."""

    def error(a: float, b: float) -> float:
        return sum(((a + b * x) / t - 1.0) ** 2 for x, t in points)

    w = [1.0 / (t * t) for _, t in points]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, points, strict=True))
    sy = sum(wi * t for wi, (_, t) in zip(w, points, strict=True))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, points, strict=True))
    sxy = sum(wi * x * t for wi, (x, t) in zip(w, points, strict=True))
    det = sw * sxx - sx * sx
    candidates = []
    if det > 0:
        b = (sw * sxy - sx * sy) / det
        a = (sy - b * sx) / sw
        if a >= 0 and b >= 0:
            candidates.append((a, b))
    if sxx > 0:
        candidates.append((0.0, max(sxy / sxx, 0.0)))  # through the origin
    candidates.append((sy / sw, 0.0))  # constant
    a, b = min(candidates, key=lambda ab: error(*ab))
    return a, b, error(a, b)


def _boundary(left: float, right: float) -> float:
    """Where one segment hands over to the next: the geometric midpoint of the samples."""
    return math.sqrt(left * right) if left > 0 and right > 0 else (left + right) / 2


def fit_piecewise(
    samples: Sequence[tuple[float, float]], max_segments: int = 3, min_points: int = 2
) -> PiecewiseFit:
    """Fit ``(flops, seconds)`` samples; at least one sample with positive time needed."""
    points = sorted((float(x), float(t)) for x, t in samples if t > 0)
    if not points:
        raise ValueError("no positive timings to fit")

    def build(cuts: tuple[int, ...]) -> tuple[PiecewiseFit, float]:
        bounds = (0, *cuts, len(points))
        segs, total = [], 0.0
        for k, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            a, b, err = _fit_line(points[lo:hi])
            total += err
            start = 0.0 if k == 0 else _boundary(points[lo - 1][0], points[lo][0])
            end = math.inf if hi == len(points) else _boundary(points[hi - 1][0], points[hi][0])
            segs.append(Segment(start, end, a, b))
        return PiecewiseFit(tuple(segs)), total

    best, best_err = build(())
    for k in range(1, max_segments):
        options = [c for c in _cut_sets(len(points), k, min_points)]
        if not options:
            break
        fit, err = min((build(c) for c in options), key=lambda fe: fe[1])
        if err < 0.5 * best_err:
            best, best_err = fit, err
        else:
            break
    return best


def _cut_sets(n: int, k: int, min_points: int) -> list[tuple[int, ...]]:
    """All ways to cut n sorted points into k + 1 runs of at least ``min_points`` each."""
    out: list[tuple[int, ...]] = []

    def walk(start: int, left: int, acc: tuple[int, ...]) -> None:
        if left == 0:
            if n - start >= min_points:
                out.append(acc)
            return
        for cut in range(start + min_points, n - min_points * left + 1):
            walk(cut, left - 1, (*acc, cut))

    walk(0, k, ())
    return out
