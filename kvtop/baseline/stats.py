"""The statistics behind ``kvtop compare``: quantiles of samples and the Mann–Whitney rank
test (exact where it can be, the normal approximation with a tie correction where not).

The rank test asks whether the values of one run tend to be higher than the other's without
assuming any distribution: per-minute KV usage, queue lengths and latency quantiles are
skewed, bounded and often tied (a queue that is empty most minutes), which a t-test handles
badly. docs/baseline-format.md says how it is used and what its false-alarm rate measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

# Exact p-values are counted for samples up to this size each, without ties; beyond, or
# with ties, the normal approximation is close enough (and conservative for small samples).
EXACT_MAX = 25


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ranks(values: list[float]) -> tuple[list[float], list[int]]:
    """Average ranks (1-based) of ``values`` and the sizes of their groups of ties."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties: list[int] = []
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for index in order[start:end + 1]:
            ranks[index] = (start + end) / 2 + 1
        ties.append(end - start + 1)
        start = end + 1
    return ranks, ties


@lru_cache(maxsize=256)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n+m, n) orderings give each value of U (no ties)."""
    if n == 0 or m == 0:
        return (1,)
    with_n_last = _u_counts(n - 1, m)  # the largest value is from the first sample: U += m
    with_m_last = _u_counts(n, m - 1)
    counts = [0] * (n * m + 1)
    for u, count in enumerate(with_n_last):
        counts[u + m] += count
    for u, count in enumerate(with_m_last):
        counts[u] += count
    return tuple(counts)


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(U of ``b`` over ``a``, two-sided p-value). U counts the pairs where ``b``'s value
    is the higher (ties count a half): above n·m/2, ``b`` tends to be higher. p is 1 when
    either sample is empty or every value is the same."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return 0.0, 1.0
    ranks, ties = _ranks([*a, *b])
    u = sum(ranks[n:]) - m * (m + 1) / 2
    if max(ties) == 1 and n <= EXACT_MAX and m <= EXACT_MAX:
        counts = _u_counts(m, n)
        tail = min(u, n * m - u)
        p = 2 * sum(counts[: math.floor(tail) + 1]) / math.comb(n + m, n)
        return u, min(1.0, p)
    total = n + m
    tie_term = sum(t ** 3 - t for t in ties) / (total * (total - 1))
    variance = n * m / 12 * ((total + 1) - tie_term)
    if variance <= 0:
        return u, 1.0
    z = max(0.0, abs(u - n * m / 2) - 0.5) / math.sqrt(variance)
    return u, math.erfc(z / math.sqrt(2))  # z >= 0: at most 1
