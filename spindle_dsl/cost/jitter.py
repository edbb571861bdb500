"""When the last of several concurrent stages ends, if each strays from its expected time.

Ranks running different pieces side by side meet at the next wave boundary (an activation
exchange), where the earliest waits for the latest. Priced at each piece's expected time, a
balanced wave looks free of waiting; but every stage strays (a shared machine's cores do not
run at one speed, and a profile point is a mean), and the latest of several stages that each
stray is later on average than any of their expected ends: for two equal stages of standard
deviation sigma, by sigma / sqrt(pi) (0.56 sigma). A plan whose groups meet at every wave pays
that at every wave, one whose ranks all run the same shard does not; pricing it lets the
planner weigh a concurrent layout's gain against the waiting it brings.

The expected maximum of independent normal variables is Clark's (1961) moment-matching
approximation: the maximum of two normals has an exact mean and variance, is taken as normal,
and is folded in with the next.
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
