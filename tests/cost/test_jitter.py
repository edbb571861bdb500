"""The expected end of the latest of several straying stages (``cost.jitter``)."""

from __future__ import annotations

import math
import random

import pytest

from spindle_dsl.cost.jitter import expected_latest, max_of_two
from spindle_dsl.cost.profiler import rank_jitter


def test_no_jitter_or_one_stage_is_the_plain_maximum() -> None:
    assert expected_latest([3.0, 5.0, 4.0], 0.0) == 5.0
    assert expected_latest([5.0], 0.3) == 5.0
    assert expected_latest([], 0.3) == 0.0
    assert expected_latest([0.0, 2.0], 0.3) == 2.0  # an idle group strays from nothing


def test_two_equal_stages_end_sigma_over_root_pi_late() -> None:
    # E[max] of two independent N(mu, sigma^2) is mu + sigma / sqrt(pi), exactly
    assert expected_latest([10.0, 10.0], 0.2) == pytest.approx(10.0 + 2.0 / math.sqrt(math.pi))


def test_a_stage_far_longer_than_the_rest_sets_the_end() -> None:
    assert expected_latest([10.0, 1.0], 0.05) == pytest.approx(10.0, rel=1e-6)


def test_clark_matches_sampling_for_several_unequal_stages() -> None:
    rng = random.Random(0)
    stages, jitter = [8.0, 10.0, 9.0, 10.5], 0.25
    draws = 200_000
    total = sum(max(rng.gauss(s, jitter * s) for s in stages) for _ in range(draws))
    assert expected_latest(stages, jitter) == pytest.approx(total / draws, rel=0.01)
    assert expected_latest(stages, jitter) > max(stages)


def test_max_of_two_moments() -> None:
    mean, var = max_of_two(0.0, 1.0, 0.0, 1.0)
    assert mean == pytest.approx(1 / math.sqrt(math.pi))
    assert var == pytest.approx(1 - 1 / math.pi)  # Var max of two iid N(0, 1)


def test_rank_jitter_is_what_the_ranks_do_not_share() -> None:
    alike = [[[1.0], [2.0], [1.5]], [[1.0], [2.0], [1.5]]]  # slowed alike turn by turn
    assert rank_jitter(alike) == 0.0
    assert rank_jitter([[[1.0]]]) == 0.0  # one rank
    # ranks straying independently by 20%: the estimate finds it ...
    rng = random.Random(1)
    turns = [[[1.0 + 0.2 * rng.gauss(0, 1)] for _ in range(4000)] for _ in range(3)]
    assert rank_jitter(turns) == pytest.approx(0.2, rel=0.06)
    # ... and one rank descheduled for a few whole turns does not move it
    for t in range(0, 4000, 100):
        turns[0][t] = [5.0]
    assert rank_jitter(turns) == pytest.approx(0.2, rel=0.08)


def test_ranks_running_one_stage_each_stray_on_their_own() -> None:
    # two ranks of one stage are two stages; one rank of it, no wait
    assert expected_latest([10.0], 0.2, [2]) == pytest.approx(10.0 + 2.0 / math.sqrt(math.pi))
    assert expected_latest([10.0], 0.2, [1]) == 10.0
    assert expected_latest([10.0, 4.0], 0.2, [0, 3]) == expected_latest([4.0], 0.2, [3])
    # n copies folded by doubling match sampling the latest of n ranks
    rng = random.Random(1)
    stages, ranks, jitter = [8.0, 10.0], [5, 3], 0.2
    draws = 100_000
    total = sum(
        max(rng.gauss(s, jitter * s) for s, c in zip(stages, ranks, strict=True) for _ in range(c))
        for _ in range(draws)
    )
    assert expected_latest(stages, jitter, ranks) == pytest.approx(total / draws, rel=0.01)
    assert expected_latest(stages, jitter, ranks) > expected_latest(stages, jitter)
