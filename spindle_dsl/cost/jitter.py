"""When the last of several ranks arrives where they meet, if each rank's stages stray.

Ranks meet where an activation exchange connects them (the runtime has no barrier between
waves: a rank blocks only in the exchanges it takes part in) and at the end of the step (the
gradient collectives and the closing all-reduce). Priced at each stage's expected time, a
balanced wave looks free of waiting; but every stage strays (a shared machine's cores do not
run at one speed, and a profile point is a mean), and the latest of several ranks that each
stray arrives later on average than any of their expected arrivals: for two equal stages of
standard deviation sigma, by sigma / sqrt(pi) (0.56 sigma). Measured on tiny_mm's default plan
on 2 ranks, the same stage on both ranks of one group ended 10-13% later on the slower rank
than on the pair's mean, step after step, and that wait sat in the next exchange.

So the ranks of one group stray independently of each other as much as the ranks of two
groups, and what decides the cost is how often they meet: a plan whose ranks exchange at
every wave pays the wait at every wave; one whose ranks run every MetaOp on the same devices
(the sequential plan) meets only at the end, where the strays of all its stages have partly
cancelled (their variances add, so the spread grows as the square root of the stages' sum of
squares, not as their sum). ``meeting_waits`` prices that.

The expected maximum of independent normal variables is Clark's (1961) moment-matching
approximation: the maximum of two normals has an exact mean and variance, is taken as normal,
and is folded in with the next.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def _pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def max_of_two(mean_a: float, var_a: float, mean_b: float, var_b: float) -> tuple[float, float]:
    """Mean and variance of max(A, B) for independent normal A and B (Clark's moments)."""
    theta = math.sqrt(var_a + var_b)
    if theta <= 1e-15 * max(abs(mean_a), abs(mean_b), 1.0):
        return (mean_a, var_a) if mean_a >= mean_b else (mean_b, var_b)
    alpha = (mean_a - mean_b) / theta
    up, down, dens = _cdf(alpha), _cdf(-alpha), _pdf(alpha)
    mean = mean_a * up + mean_b * down + theta * dens
    second = (
        (mean_a * mean_a + var_a) * up
        + (mean_b * mean_b + var_b) * down
        + (mean_a + mean_b) * theta * dens
    )
    return mean, max(second - mean * mean, 0.0)


def expected_latest(seconds: Sequence[float], jitter: float) -> float:
    """The expected end of the latest of stages expected to take ``seconds``, each straying
    independently with standard deviation ``jitter`` times its length (at least the longest
    expected length; equal to it with no jitter or one stage)."""
    stages = [s for s in seconds if s > 0]
    if not stages:
        return 0.0
    if jitter <= 0 or len(stages) == 1:
        return max(stages)
    mean, var = stages[0], (jitter * stages[0]) ** 2
    for s in stages[1:]:
        mean, var = max_of_two(mean, var, s, (jitter * s) ** 2)
    return max(mean, max(stages))


def meeting_waits(
    stages: Sequence[Mapping[int, float]],
    lengths: Sequence[float],
    meets: Sequence[Sequence[frozenset[int]]],
    jitter: float,
) -> tuple[list[float], float]:
    """The expected wait at each wave's start and at the step's end when ranks' stages stray.

    The waves run back to back, wave w for ``lengths[w]`` seconds (its slowest rank, with
    nothing straying); rank d is busy ``stages[w][d]`` of it (absent: idle). The ranks of each
    set in ``meets[w]`` meet at wave w's start (an exchange), every rank at the end. A rank that
    meets nobody runs on: it carries forward the slack of the waves it was not the slowest in
    (``lead``, seconds ahead of the back-to-back waves) and the variance of its stages since it
    last met someone (each stage straying independently by ``jitter`` times its length). Where
    ranks meet, the wait is how far the expected latest arrival (Clark's maximum) lies past the
    waves' boundary, never below 0: the waves' times already hold every rank's expected work.
    Returns each wave's wait (at its start) and the end's."""
    devices = sorted(
        {d for stage in stages for d in stage} | {d for m in meets for g in m for d in g}
    )
    lead = dict.fromkeys(devices, 0.0)
    var = dict.fromkeys(devices, 0.0)

    def latest(ranks) -> float:
        ranks = [d for d in ranks if d in lead]
        if jitter <= 0 or not ranks:
            return 0.0
        mean, v = -lead[ranks[0]], var[ranks[0]]
        for d in ranks[1:]:
            mean, v = max_of_two(mean, v, -lead[d], var[d])
        return max(mean, 0.0)

    waits = []
    for stage, length, groups in zip(stages, lengths, meets, strict=True):
        # each group waits for its own latest; the wave starts when the latest group is ready
        wait = max((latest(sorted(g)) for g in groups if len(g) > 1), default=0.0)
        waits.append(wait)
        met = set().union(*groups) if groups else set()
        for d in devices:
            if d in met:
                lead[d], var[d] = 0.0, 0.0
            else:
                lead[d] += wait
            busy = stage.get(d, 0.0)
            lead[d] += max(length - busy, 0.0)
            var[d] += (jitter * busy) ** 2
    return waits, latest(devices)
