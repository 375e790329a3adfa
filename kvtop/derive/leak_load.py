"""KV blocks the load does not explain: the leak detector's witness under continuous load.

vLLM counts a request's prompt tokens at its first token and every generated token as it
comes, and when a request ends it adds its prompt and generated tokens to the
``request_prompt_tokens`` / ``request_generation_tokens`` histograms. Their difference is
the context of the requests in flight, the *tokens in flight*; the blocks they hold follow
it (a block holds ``block_size`` tokens, and each request rounds up one block). A leaked
block belongs to no request in flight, so the level the load does not explain,

    unexplained = used blocks − (b · tokens in flight + c · running + d · tokens in flight
                  × prefix hit rate + e · prompt tokens/s + f · deferred waiting),

is the leak plus noise. The coefficients come from the levels, fitted together with a
hinge — a leak that begins at some τ and grows from then on — so that the load is not asked
to explain the leak (the bucket-to-bucket changes the first pass fitted on doubled the
noise and read a leak that grew through a diurnal swing's peak as load). A leak shows as
the unexplained level stepping up and staying up (the split of the window into "before" and
"after" whose rank test says "after is higher" most surely), or drifting up from τ (the
hinge: a smooth leak's split lands inside it, so "after less before" sees only part).

What the tokens in flight miss is kept out, never guessed: a bucket with a preemption (and
the one after it: preempted requests wait with their tokens counted and no blocks) or with
the pool pinned full is left out; a request aborted before its first token leaves its
prompt counted as finished and never as processed, so the ledger under-counts from then on
by up to that prompt — the worst case (every abort while requests waited was one) is added
back, which can only lower the unexplained level. Method and thresholds:
docs/leak-detector.md.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise

from kvtop.derive.leak_estimate import RIDGE

MIN_AFTER = 3  # buckets after the hinge's τ: a single outlier at the end is no drift
TRIM_SIGMAS = 3.5  # a change this many robust σ above what the load explains is a lump
MAX_LUMPS = 3  # lumps fitted as steps, the largest (each a column of the fit)
HINGE_Z = 3.5  # the hinge's drift counts in the rise from this sure on (slope / its error)
TAU_EVERY = 2  # the hinge's τ tried at every other bucket: half the cost, a minute's error
MAD_TO_SIGMA = 1.4826  # a normal distribution's σ per median absolute deviation


@dataclass(frozen=True, slots=True)
class LoadBucket:
    """One closed bucket as the witness needs it."""

    t: float  # seconds, the bucket's middle
    level: float  # mean used blocks
    in_flight: float  # mean tokens in flight
    running: float  # mean running requests
    shared: float  # mean tokens in flight × the bucket's prefix hit rate
    prompt_rate: float  # prompt tokens per second
    deferred: float  # mean waiting requests deferred (a KV transfer, the LoRA budget)
    lost: float  # tokens the ledger may have lost in the bucket (aborts while requests waited)
    usable: bool  # no preemption in it or the bucket before, not pinned full


@dataclass(frozen=True, slots=True)
class Unexplained:
    """The window's unexplained level and its step."""

    now: float  # unexplained blocks, median of the latest buckets
    base: float  # ...and before the split
    rise: float  # now − base, or the drift if larger
    drift: float  # blocks the fit's hinge adds from τ to now: a smooth leak's split lands
    # inside it, so now − base sees only its part after the split
    drift_z: float  # the hinge's slope over its standard error
    leaked: float  # now − the lower of base and the window's first buckets: a smooth leak's
    # split lands inside it, so its base already holds part of the leak
    z: float  # the split's rank statistic (0: no split)
    split_t: float | None  # time of the first bucket after the split
    step: float  # the split's step: median after it less median before (0: no split)
    still_up: bool  # the latest buckets hold at least half the split's step
    explained_now: float  # blocks the load explains now (mean of the latest buckets)
    in_flight_now: float  # tokens in flight now (the same buckets)
    per_token: float  # blocks per token in flight, as fitted
    noise: float  # robust σ of one bucket's unexplained level before the split
    buckets: int  # usable buckets in the window
    lost_tokens: float  # tokens the ledger may have lost in the window, added back


def explain(buckets: Sequence[LoadBucket], recent: int, min_side: int,
            min_buckets: int, clean: Sequence[LoadBucket] = (), latest: int = 4
            ) -> Unexplained | None:
    """The unexplained level over the usable buckets; None with fewer than `min_buckets`.
    `clean`: buckets from before a clean point (no leak then), a baseline for `leaked`,
    which is the mean of the `latest` buckets (a mean lags a growing leak less than a
    median) over that baseline."""
    usable = [b for b in buckets if b.usable]
    if len(usable) < max(min_buckets, 2 * min_side, 4):
        return None
    lost = 0.0
    rows = []
    for bucket in buckets:  # a token lost stays lost: add back the worst case from then on
        lost += bucket.lost
        if bucket.usable:
            rows.append(_features(bucket, lost))
    hours = [(b.t - usable[0].t) / 3600 for b in usable]
    levels = [b.level for b in usable]
    lumps = _lumps(levels, rows)  # fitted as steps, so that the load does not take them in
    stepped = [[*row, *(float(j >= i) for i in lumps)] for j, row in enumerate(rows)]
    fit = _fit_levels(levels, stepped, hours)
    coef = fit.per_unit[:len(rows[0])]
    explained = [_dot(coef, row) for row in rows]
    residual = [b.level - e for b, e in zip(usable, explained, strict=True)]
    # Buckets from before the last clean point held no leak: with the same fit, they are
    # the "before" of a leak that began right after it (the window restarted there) —
    # those whose load the window's own buckets span (see `comparable`).
    clean = comparable(clean, rows)
    earlier = [b.level - _dot(coef, _features(b, 0.0)) for b in clean]
    judged = earlier + residual
    split = best_split(judged, min_side)
    tail = residual[-recent:]
    now = statistics.median(tail)
    k, z = split if split is not None else (len(judged), 0.0)
    base = statistics.median(judged[:k])
    step = statistics.median(judged[k:]) - base if k < len(judged) else 0.0
    noise = MAD_TO_SIGMA * statistics.median(abs(v - base) for v in judged[:k])
    start = statistics.median(judged[:recent])
    times = [b.t for b in clean] + [b.t for b in usable]
    leaked = statistics.fmean(residual[-latest:]) - min(base, start)
    # A smooth leak's split lands inside it: now − base sees only its part after the
    # split. The fit's hinge sees it from τ on, but a line overshoots a lump at its end:
    # the drift counts only as far as the leaked-block estimate. And only when the hinge
    # is sure (HINGE_Z, as sure as a split must be): on a load ramp the load's columns
    # and the hinge nearly coincide, the hinge takes up the bend of a level that is not
    # linear in the load, and its slope's error is then as large as the bend.
    rise = max(now - base, min(fit.drift, leaked)) if fit.drift_z >= HINGE_Z else now - base
    return Unexplained(
        now=now, base=base, rise=rise, drift=fit.drift,
        leaked=leaked, z=z, drift_z=fit.drift_z,
        split_t=times[k] if k < len(times) else None,
        step=step, still_up=step > 0 and now - base >= step / 2,
        explained_now=statistics.fmean(explained[-recent:]),
        in_flight_now=statistics.fmean(b.in_flight for b in usable[-recent:]),
        per_token=coef[0], noise=noise, buckets=len(usable), lost_tokens=lost)


def comparable(clean: Sequence[LoadBucket], rows: Sequence[Sequence[float]]
               ) -> list[LoadBucket]:
    """The clean buckets whose every load feature lies within the range the window's
    buckets (`rows`) span. The window's fit is a plane through the loads it saw; beyond
    them it extrapolates, and the level is not linear in the load over a wide range. On a
    healthy ramp from 0.5x to 1.9x the load (1,500 blocks), the buckets before a drain at
    the ramp's foot, judged by the fit of the window after it, sat ~30 blocks (2 % of the
    pool) below it — a step that was no leak and became a false LEAK. A fit of both sides
    together does not help: the line bends, and its hinge then takes the bend."""
    lows = [min(col) for col in zip(*rows, strict=True)]
    highs = [max(col) for col in zip(*rows, strict=True)]
    return [b for b in clean
            if all(lo <= v <= hi for v, lo, hi in zip(_features(b, 0.0), lows, highs,
                                                       strict=True))]


def _features(bucket: LoadBucket, lost: float) -> list[float]:
    return [bucket.in_flight + lost, bucket.running, bucket.shared, bucket.prompt_rate,
            bucket.deferred]


def _lumps(levels: list[float], rows: list[list[float]]) -> list[int]:
    """Buckets the level jumped into by more than the load's change explains — by over
    TRIM_SIGMAS robust σ of what a least-squares fit of the bucket-to-bucket changes on the
    load's changes misses (at most MAX_LUMPS, the largest): lumps. A hinge fits a lump
    badly, and where the load ramps a levels fit takes a lump in as load; in changes, a
    lump is one change, whatever the load did."""
    d_level = [b - a for a, b in pairwise(levels)]
    changes = ([b - a for a, b in pairwise(col)] for col in zip(*rows, strict=True))
    columns = [[1.0] * len(d_level), *(col for col in changes if any(col))]
    scale = [math.sqrt(_dot(col, col) / len(col)) or 1.0 for col in columns]
    scaled = [[v / sd for v in col] for col, sd in zip(columns, scale, strict=True)]
    inverse = _inverse(_gram(scaled))
    if inverse is None:
        return []
    xty = [_dot(col, d_level) for col in scaled]
    coef = [_dot(row, xty) for row in inverse]
    misses = [y - _dot(coef, row)
              for y, row in zip(d_level, zip(*scaled, strict=True), strict=True)]
    spread = MAD_TO_SIGMA * statistics.median(abs(m) for m in misses)
    jumps = sorted((m, i + 1) for i, m in enumerate(misses) if m > TRIM_SIGMAS * spread)
    return sorted(i for _, i in jumps[-MAX_LUMPS:])


@dataclass(frozen=True, slots=True)
class _Fit:
    per_unit: list[float]  # blocks per unit of each feature
    drift: float  # blocks the hinge adds from τ to the last bucket (≥ 0)
    drift_z: float = 0.0  # the hinge's slope over its standard error


def _fit_levels(levels: list[float], rows: list[list[float]], hours: list[float]) -> _Fit:
    """Least squares of the levels on an intercept, the load features and a *hinge* from a
    bucket τ on, the hinge ``s · max(0, t − τ)`` (at least MIN_AFTER buckets after τ, τ where
    it fits best, s of either sign): a leak only adds blocks from some time on, so the
    load's coefficients are not asked to explain it — without the hinge a leak that grows
    while the load is high (a diurnal swing's peak) is read as blocks per unit of load. A
    hinge, not a step: on the tuning part a step (or a step and a hinge) also fitted the
    turn of a load ramp into a full batch, and raised WATCH on it.

    Partitioned: the fit without the hinge once, then for each τ the hinge's gain in closed
    form from suffix sums, (h'e)² / h'Mh with M the residual maker of the load columns, so
    each τ costs O(features²), not a solve."""
    n, every = len(levels), [list(col) for col in zip(*rows, strict=True)]
    # A feature that never moves in the window (no deferred requests) explains nothing: 0.
    moving = [j for j, col in enumerate(every) if max(col) > min(col)]
    columns = [every[j] for j in moving]
    means = [sum(col) / n for col in columns]
    spreads = [math.sqrt(sum((v - m) ** 2 for v in col) / n) or 1.0
               for col, m in zip(columns, means, strict=True)]
    cols = [[1.0] * n, *([(v - m) / sd for v in col]
                         for col, m, sd in zip(columns, means, spreads, strict=True))]
    x = [list(row) for row in zip(*cols, strict=True)]
    width = len(cols)
    inverse = _inverse(_gram(cols))
    if inverse is None:
        return _Fit([0.0] * len(every), 0.0)
    xty = [_dot(col, levels) for col in cols]
    coef = [_dot(row, xty) for row in inverse]
    errors = [y - _dot(coef, a) for a, y in zip(x, levels, strict=True)]
    # Suffix sums over buckets k..n−1 for every k ≥ 1, one column at a time (accumulate
    # runs in C; a Python loop over the buckets was most of the fit's cost): position
    # n − 1 − k holds bucket k's.
    t_back = hours[:0:-1]  # buckets n − 1 down to 1
    suffix = [list(accumulate(col[:0:-1])) for col in cols]
    suffix_t = [list(accumulate(map(operator.mul, t_back, col[:0:-1]))) for col in cols]
    sum_t = list(accumulate(t_back))
    sum_tt = list(accumulate(map(operator.mul, t_back, t_back)))
    sum_e = list(accumulate(errors[:0:-1]))
    sum_te = list(accumulate(map(operator.mul, t_back, errors[:0:-1])))

    def sums_at(k: int) -> tuple[list[float], list[float], float, float, float, float]:
        at = n - 1 - k
        return ([col[at] for col in suffix], [col[at] for col in suffix_t], sum_t[at],
                sum_tt[at], sum_e[at], sum_te[at])

    best: tuple[float, int] | None = None  # the hinge's gain, k
    for k in range(n - MIN_AFTER, 0, -TAU_EVERY):  # the hinge is 0 up to bucket k − 1
        sum_x, sum_tx, t1, t2, e1, te = sums_at(k)
        tau = hours[k - 1]
        xh = [tx - tau * v for tx, v in zip(sum_tx, sum_x, strict=True)]
        hmh = t2 - 2 * tau * t1 + tau * tau * (n - k) - _quad(inverse, xh, xh)
        he = te - tau * e1
        if hmh > 1e-12 and (best is None or he * he / hmh > best[0]):
            best = (he * he / hmh, k)
    drift = drift_z = 0.0
    if best is not None:
        coef, drift = _shifted(coef, inverse, sums_at(best[1]), hours, best[1])
        sse = sum(e * e for e in errors) - best[0]  # the hinge's gain is what it removes
        dof = n - width - 1
        drift_z = math.sqrt(best[0] * dof / sse) if sse > 0 and dof > 0 else math.inf
    per_unit = [0.0] * len(every)
    for j, c, sd in zip(moving, coef[1:], spreads, strict=True):
        per_unit[j] = c / sd
    return _Fit(per_unit, drift, drift_z)


def _shifted(coef: list[float], inverse: list[list[float]],
             sums: tuple[list[float], list[float], float, float, float, float],
             hours: list[float], k: int) -> tuple[list[float], float]:
    """The load columns' coefficients with the hinge from bucket k on, and the blocks it
    adds by the last bucket (never below 0: a leak only adds)."""
    sum_x, sum_tx, sum_t, sum_tt, sum_e, sum_te = sums
    tau, count = hours[k - 1], len(hours) - k
    xh = [tx - tau * v for tx, v in zip(sum_tx, sum_x, strict=True)]
    hmh = sum_tt - 2 * tau * sum_t + tau * tau * count - _quad(inverse, xh, xh)
    slope = (sum_te - tau * sum_e) / hmh
    coef = [c - slope * _dot(row, xh) for c, row in zip(coef, inverse, strict=True)]
    return coef, max(slope * (hours[-1] - tau), 0.0)


def _gram(cols: list[list[float]]) -> list[list[float]]:
    """X'X of these columns, each product once (it is symmetric)."""
    gram = [[0.0] * len(cols) for _ in cols]
    for i, a in enumerate(cols):
        for j in range(i, len(cols)):
            gram[i][j] = gram[j][i] = _dot(a, cols[j])
    return gram


def _quad(inverse: list[list[float]], a: list[float], b: list[float]) -> float:
    """a' G b."""
    return _dot(a, [_dot(row, b) for row in inverse])


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(map(operator.mul, a, b))


def _inverse(matrix: list[list[float]]) -> list[list[float]] | None:
    """The inverse by Gauss–Jordan with partial pivoting, with leak_estimate's tiny ridge on
    all but the intercept (a feature that never moves, such as deferred requests where none
    are, then gets 0); None if singular all the same."""
    size, n = len(matrix), matrix[0][0]
    aug = [[v + (RIDGE * n if i == j and i else 0.0) for j, v in enumerate(row)]
           + [1.0 if i == j else 0.0 for j in range(size)] for i, row in enumerate(matrix)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(aug[r][col]))
        if abs(aug[pivot][col]) < 1e-12:
            return None
        aug[col], aug[pivot] = aug[pivot], aug[col]
        lead = aug[col][col]
        aug[col] = [v / lead for v in aug[col]]
        for r in range(size):
            if r != col and aug[r][col]:
                factor = aug[r][col]
                aug[r] = [a - factor * b for a, b in zip(aug[r], aug[col], strict=True)]
    return [row[size:] for row in aug]


def best_split(values: Sequence[float], side: int) -> tuple[int, float] | None:
    """(k, z): the split into [:k] and [k:] whose Mann–Whitney z (later above earlier) is
    largest, at least `side` values a side. Every split ranks the same values, so the rank
    sums of the later part come from one sort: O(n log n) for all splits."""
    n = len(values)
    if n < 2 * side:
        return None
    ranks = _ranks(values)
    after = sum(ranks[side:])
    best: tuple[int, float] | None = None
    for k in range(side, n - side + 1):
        if k > side:
            after -= ranks[k - 1]
        n1, n2 = k, n - k
        u = after - n2 * (n2 + 1) / 2  # pairs (later, earlier) with the later above
        z = (u - n1 * n2 / 2) / math.sqrt(n1 * n2 * (n + 1) / 12)
        if best is None or z > best[1]:
            best = (k, z)
    return best


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    for position, index in enumerate(order, 1):
        ranks[index] = float(position)
    if len(set(values)) == len(values):
        return ranks
    i = 0
    while i < len(order):  # ties: measured levels seldom tie, constructed ones do
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
