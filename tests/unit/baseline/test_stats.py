"""The rank test behind ``kvtop compare`` (kvtop/baseline/stats.py): U and the exact two-sided
p-value up to 25 values a side without ties, the normal approximation with its tie and
continuity corrections beyond, each checked against a count or the formula worked by hand."""

from __future__ import annotations

import math
from itertools import combinations

import pytest

from kvtop.baseline.stats import EXACT_MAX, mann_whitney, mean


def test_the_mean_of_nothing_is_unknown() -> None:
    assert mean([]) is None
    assert mean([1.0, 2.0, 6.0]) == 3.0


def brute_force_p(a: list[float], b: list[float]) -> float:
    """Two-sided exact p by listing every split of the pooled values (no ties)."""
    pooled, n, m = [*a, *b], len(a), len(b)

    def u_of(first: tuple[float, ...]) -> float:
        second = [v for v in pooled if v not in first]
        return sum(1 for x in first for y in second if y > x)

    u = u_of(tuple(a))
    tail = min(u, n * m - u)
    splits = [u_of(c) for c in combinations(pooled, n)]
    return min(1.0, 2 * sum(1 for s in splits if s <= tail) / len(splits))


def test_complete_separation_exactly() -> None:
    """5 and 5 apart: U 25 (every pair b higher) and p = 2 / C(10, 5); reversed, U 0."""
    assert mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == (25, pytest.approx(2 / 252))
    assert mann_whitney([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == (0, pytest.approx(2 / 252))
    assert mann_whitney([1, 2, 3], [4, 5, 6])[1] == pytest.approx(0.1)


@pytest.mark.parametrize(("a", "b"), [
    ([1, 5, 9], [2, 3, 4, 10]),
    ([1, 3, 8, 12], [2, 7, 9]),
    ([4, 6], [1, 2, 3, 5, 7]),
    ([2, 9, 11, 13, 14], [1, 3, 4]),
])
def test_the_exact_p_value_is_the_share_of_splits_as_extreme(a: list[float],
                                                             b: list[float]) -> None:
    u, p = mann_whitney(a, b)
    assert u == sum(1 for x in a for y in b if y > x)
    assert p == pytest.approx(brute_force_p(a, b))


def test_a_balanced_interleaving_is_p_1_not_more() -> None:
    assert mann_whitney([1, 4], [2, 3]) == (2, 1.0)


def test_exact_up_to_25_a_side_then_normal() -> None:
    """Complete separation: exact, 2 / C(50, 25) at 25 and 25; at 26 (either side) the normal
    approximation: z = (n·m/2 - 0.5) / sqrt(n·m·(n+m+1)/12)."""
    assert EXACT_MAX == 25
    low, high = [float(i) for i in range(25)], [float(i) for i in range(100, 125)]
    assert mann_whitney(low, high) == (625, pytest.approx(2 / math.comb(50, 25)))
    for n, m in ((26, 2), (2, 26)):
        a, b = [float(i) for i in range(n)], [float(i) for i in range(100, 100 + m)]
        z = (n * m / 2 - 0.5) / math.sqrt(n * m * (n + m + 1) / 12)
        assert mann_whitney(a, b) == (n * m, pytest.approx(math.erfc(z / math.sqrt(2))))


def test_ties_take_average_ranks_and_the_normal_approximation_corrects_for_them() -> None:
    """a 1 1 2, b 2 3 3: ranks 1.5 1.5 3.5 | 3.5 5.5 5.5, U = 14.5 - 6 = 8.5; three ties of
    two: the variance 9/12 · (7 - 3·6/30) = 4.8; z = (|8.5 - 4.5| - 0.5) / sqrt(4.8)."""
    u, p = mann_whitney([1, 1, 2], [2, 3, 3])
    assert u == 8.5
    assert p == pytest.approx(math.erfc(3.5 / math.sqrt(4.8) / math.sqrt(2)))
    assert mann_whitney([3, 3, 2], [2, 1, 1]) == (0.5, pytest.approx(p))


def test_within_half_a_pair_of_the_middle_is_no_evidence() -> None:
    """Ties: U exactly n·m/2, the continuity correction leaves z at 0, not below."""
    assert mann_whitney([1, 2, 2], [2, 1, 2]) == (4.5, 1.0)


def test_nothing_to_rank_is_no_evidence() -> None:
    assert mann_whitney([1, 1, 1], [1, 1, 1]) == (4.5, 1.0)  # no variance left
    assert mann_whitney([], [1.0]) == (0.0, 1.0)
    assert mann_whitney([1.0], []) == (0.0, 1.0)
    assert mann_whitney([], []) == (0.0, 1.0)


def test_one_value_a_side_is_ranked_like_any_other() -> None:
    """One against five, apart: U 5 or 0 and p = 2 / 6, exactly."""
    assert mann_whitney([1], [2, 3, 4, 5, 6]) == (5, pytest.approx(1 / 3))
    assert mann_whitney([2, 3, 4, 5, 6], [1]) == (0, pytest.approx(1 / 3))


def test_a_small_variance_is_still_a_variance() -> None:
    """2 against a tied 1 1: U 0, variance 2/12 · (4 - 6/6) = 0.5, z = (1 - 0.5) / sqrt(0.5)."""
    assert mann_whitney([2], [1, 1]) == (
        0.0, pytest.approx(math.erfc(0.5 / math.sqrt(0.5) / math.sqrt(2))))


def test_the_normal_approximation_agrees_with_the_exact_count() -> None:
    """20 a side, shifted: the exact p, and with one tie added (approximated) close to it."""
    a, b = [float(i) for i in range(0, 40, 2)], [float(i) + 5 for i in range(0, 40, 2)]
    exact = mann_whitney(a, b)[1]
    tied = mann_whitney([*a, 100.0], [*b, 100.0])[1]
    assert 0.01 < exact < 0.5 and tied == pytest.approx(exact, rel=0.35)
