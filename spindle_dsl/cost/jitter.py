"""When the last of several concurrent stages ends, if each strays from its expected time.

Every rank of a wave runs its stage and meets other ranks at the next exchange or collective:
a group's activations go to the next group, and the ranks of one data-parallel group meet at
their gradient buckets and at the step's closing all-reduce, where the earliest waits for the
latest. Priced at each piece's expected time, a balanced wave looks free of waiting; but every
rank's stage strays (a shared machine's cores do not run at one speed, and a profile point is
a mean), and the latest of several stages that each stray is later on average than any of
their expected ends: for two equal stages of standard deviation sigma, by sigma / sqrt(pi)
(0.56 sigma). So a wave lasts, in expectation, until its latest rank, whether its ranks run
one piece or several side by side. (Charging only groups side by side would price no wait at
all for a plan whose waves each run one data-parallel group, yet there too one rank waits for
the other's gradients every step, as a trace of tiny_mm's sequential plan over 2 ranks shows.)

The expected maximum of independent normal variables is Clark's (1961) moment-matching
approximation: the maximum of two normals has an exact mean and variance, is taken as normal,
and is folded in with the next. n ranks running one stage are n independent copies, folded
by doubling (the latest of 2 copies, of 4, ...: log n steps, not n).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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


def _latest_of_copies(mean: float, var: float, copies: int) -> tuple[float, float]:
    """Mean and variance of the latest of ``copies`` independent copies of N(mean, var)."""
    out: tuple[float, float] | None = None
    power = (mean, var)  # the latest of 2**i copies
    while copies:
        if copies & 1:
            out = power if out is None else max_of_two(*out, *power)
        copies >>= 1
        if copies:
            power = max_of_two(*power, *power)
    assert out is not None
    return out


def expected_latest(
    seconds: Sequence[float], jitter: float, ranks: Sequence[int] | None = None
) -> float:
    """The expected end of the latest of stages expected to take ``seconds``, each straying
    independently with standard deviation ``jitter`` times its length (at least the longest
    expected length; equal to it with no jitter or a single rank). ``ranks[i]``: how many
    ranks run stage i, each straying on its own (one each by default)."""
    counts = [1] * len(seconds) if ranks is None else list(ranks)
    stages = [(s, c) for s, c in zip(seconds, counts, strict=True) if s > 0 and c > 0]
    if not stages:
        return 0.0
    longest = max(s for s, _ in stages)
    if jitter <= 0 or (len(stages) == 1 and stages[0][1] == 1):
        return longest
    mean, var = _latest_of_copies(stages[0][0], (jitter * stages[0][0]) ** 2, stages[0][1])
    for s, c in stages[1:]:
        mean, var = max_of_two(mean, var, *_latest_of_copies(s, (jitter * s) ** 2, c))
    return max(mean, longest)
