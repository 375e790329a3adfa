"""How many blocks have leaked, under continuous load: separate the leak from the load.

Used blocks = working set (what the running requests hold) + leaked blocks. The working set
follows the load the server exposes; the leak follows time. Over the buckets since the floor
evidence began (and the history before it, which holds the pre-leak baseline), fit

    level = a + b1 · running + b2 · running × tokens per request + s · max(0, t − τ)

by least squares, with the change point τ chosen by the smallest residual. The hinge is only
there so that the leak does not leak into the load coefficients (a, b): each bucket's leak
is then its level minus the load's share, ``level − a − b · load``, which follows a leak of
any shape (lumpy, stopping), not only a straight line. The estimate now is the mean of the
last few of those plus ``s`` × their lag, or of the newest half of them when that half sits
significantly above the rest: a lump leaked lately, and leaked blocks are never given back.
Method and measurements: docs/leak-detector.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_POINTS = 8  # fewer buckets leave the three-to-four coefficients and τ undetermined
MIN_AFTER = 3  # buckets after τ, so that a single outlier at the end is no "change"
RIDGE = 1e-6  # keeps a load feature with no variance (a pinned batch) from a singular fit
MIN_NOISE_POINTS = 5  # buckets before τ needed to measure the noise the load leaves
LUMP_Z = 3.0  # newer half of the recent buckets above the older by this many σ: a lump
# (3, not 2: the test runs at every bucket close, and huge requests give the noise long tails)


@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One closed bucket, as the estimate needs it."""

    t: float  # seconds
    level: float  # mean used blocks over the bucket
    loads: tuple[float, ...]  # load features, the same ones for every point of a fit


@dataclass(frozen=True, slots=True)
class LeakFit:
    change_t: float  # τ: where the leak's straight-line part begins
    slope_per_h: float  # s: blocks per hour after τ
    leaked: tuple[float, ...]  # per point: level minus the load's share (the leak + noise)
    times: tuple[float, ...]  # per point: its time, seconds
    noise: float | None  # σ of one point's leak before τ (None: too few points there)


def fit_leak(points: Sequence[LoadPoint]) -> LeakFit | None:
    """The change-point regression above; None with too few points to pin it down."""
    if len(points) < MIN_POINTS:
        return None
    # Load features the whole span has (a counter that appeared late is left out).
    width = min(len(p.loads) for p in points)
    base = [[1.0, *row] for row in _standardised([p.loads[:width] for p in points])]
    ys = [p.level for p in points]
    hours = [p.t / 3600 for p in points]
    columns = [list(col) for col in zip(*base, strict=True)] + [ys]
    # Only the hinge column moves with τ: sum the rest once, and the hinge's cross products
    # from suffix sums, so each τ costs O(features²), not O(points).
    gram = [[_dot(a, b) for b in columns] for a in columns]
    tails = _suffix_sums(columns, hours)
    best: tuple[float, float, list[float]] | None = None
    for k in range(1, len(points) - MIN_AFTER + 1):
        tau = hours[k - 1]  # the hinge is 0 up to and including point k − 1
        sum_c, sum_tc, sum_t, sum_tt, count = tails[k]
        cross = [tc - tau * c for c, tc in zip(sum_c, sum_tc, strict=True)]
        hh = sum_tt - 2 * tau * sum_t + tau * tau * count
        ata = [[*row[:-1], c] for row, c in zip(gram[:-1], cross[:-1], strict=True)]
        ata.append([*cross[:-1], hh])
        aty = [*(row[-1] for row in gram[:-1]), cross[-1]]
        coef = _ridge_solve(ata, aty)
        if coef is None:
            continue
        sse = gram[-1][-1] - _dot(coef, aty)  # least squares: y'y − coef'A'y (ridge: ~exact)
        if best is None or sse < best[0]:
            best = (sse, points[k - 1].t, coef)
    if best is None:
        return None
    _, change_t, coef = best
    leaked = tuple(y - _dot(row, coef[:-1]) for row, y in zip(base, ys, strict=True))
    before = [value for value, p in zip(leaked, points, strict=True) if p.t <= change_t]
    noise = statistics.pstdev(before) if len(before) >= MIN_NOISE_POINTS else None
    return LeakFit(change_t, coef[-1], leaked, tuple(p.t for p in points), noise)


def _suffix_sums(columns: list[list[float]], hours: list[float]
                 ) -> list[tuple[list[float], list[float], float, float, int]]:
    """Per start index k: Σ c, Σ t·c per column, Σ t, Σ t², count, over points k…n−1."""
    n = len(hours)
    sums: list[tuple[list[float], list[float], float, float, int]] = [
        ([0.0] * len(columns), [0.0] * len(columns), 0.0, 0.0, 0)]
    for i in range(n - 1, -1, -1):
        c, tc, st, stt, count = sums[-1]
        t = hours[i]
        sums.append(([a + col[i] for a, col in zip(c, columns, strict=True)],
                     [a + t * col[i] for a, col in zip(tc, columns, strict=True)],
                     st + t, stt + t * t, count + 1))
    return sums[::-1]


def leaked_now(fit: LeakFit, t: float, recent: int) -> float:
    """Mean leak over the last `recent` buckets, carried to `t` at the fitted rate.

    One bucket's leak is as noisy as the working set the load does not explain; a few
    buckets average that down, and the slope makes up for their age (leaked blocks only grow).
    When the newer half of them is above the older half by more than the noise explains, a
    lump leaked in between, and only the newer half tells the level now.
    """
    count = min(recent, len(fit.leaked))
    half = count // 2
    if fit.noise is not None and half >= 1:
        newer, older = fit.leaked[-half:], fit.leaked[-count:-half]
        spread = fit.noise * math.sqrt(1 / len(newer) + 1 / len(older))
        if statistics.fmean(newer) - statistics.fmean(older) > LUMP_Z * spread:
            count = half
    last = fit.leaked[-count:]
    ages = [(t - point_t) / 3600 for point_t in fit.times[-count:]]
    lag = sum(ages) / len(ages)
    return max(0.0, sum(last) / len(last) + max(fit.slope_per_h, 0.0) * lag)


def _standardised(rows: list[tuple[float, ...]]) -> list[list[float]]:
    """Centre and scale each feature, so one ridge constant fits every unit of load."""
    if not rows or not rows[0]:
        return [[] for _ in rows]
    columns = list(zip(*rows, strict=True))
    out = []
    for col in columns:
        mean = sum(col) / len(col)
        spread = (sum((v - mean) ** 2 for v in col) / len(col)) ** 0.5 or 1.0
        out.append([(v - mean) / spread for v in col])
    return [list(r) for r in zip(*out, strict=True)]


def _ridge_solve(ata: list[list[float]], aty: list[float]) -> list[float] | None:
    """Normal equations with a tiny ridge on all but the intercept (row and column 0)."""
    n = ata[0][0]  # the intercept's column is all ones: its square is the point count
    ridged = [[v + (RIDGE * n if i == j and i else 0.0) for j, v in enumerate(row)]
              for i, row in enumerate(ata)]
    return _solve(ridged, aty)


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    k = len(v)
    aug = [[*row, x] for row, x in zip(m, v, strict=True)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(aug[r][col]))
        if abs(aug[pivot][col]) < 1e-12:
            return None
        aug[col], aug[pivot] = aug[pivot], aug[col]
        for r in range(k):
            if r != col:
                factor = aug[r][col] / aug[col][col]
                aug[r] = [a - factor * b for a, b in zip(aug[r], aug[col], strict=True)]
    return [aug[i][k] / aug[i][i] for i in range(k)]


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))
