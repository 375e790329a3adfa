"""KV blocks the load does not explain: the leak detector's witness under continuous load.

vLLM counts a request's prompt tokens at its first token and every generated token as it
comes, and when a request ends it adds its prompt and generated tokens to the
``request_prompt_tokens`` / ``request_generation_tokens`` histograms. Their difference is
the context of the requests in flight, the *tokens in flight*; the blocks they hold follow
it (a block holds ``block_size`` tokens, and each request rounds up one block). A leaked
block belongs to no request in flight, so the level the load does not explain,

    unexplained = used blocks − (b · tokens in flight + c · running + d · tokens in flight
                  × prefix hit rate + e · prompt tokens/s + f · deferred waiting),

is the leak plus noise. The coefficients come from bucket-to-bucket *changes* (a leak adds
blocks at its own pace, unrelated to the load's ups and downs, so it barely moves them;
changes no load explains, the lumps, are trimmed and the fit redone). A leak shows as the
unexplained level stepping or drifting up and staying up: the split of the window into
"before" and "after" whose rank test says "after is higher" most surely.

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
from itertools import pairwise

from kvtop.derive.leak_estimate import _ridge_solve

TRIM_SIGMAS = 3.5  # a change this many robust σ from the fit is a lump (or a burst): refit
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
    rise: float  # now − base
    leaked: float  # now − the lower of base and the window's first buckets: a smooth leak's
    # split lands inside it, so its base already holds part of the leak
    z: float  # the split's rank statistic (0: no split)
    split_t: float | None  # time of the first bucket after the split
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
    coef = _fit_changes([b.level for b in usable], rows)
    explained = [sum(c * x for c, x in zip(coef, row, strict=True)) for row in rows]
    residual = [b.level - e for b, e in zip(usable, explained, strict=True)]
    split = best_split(residual, min_side)
    tail = residual[-recent:]
    now = statistics.median(tail)
    k, z = split if split is not None else (len(residual), 0.0)
    base = statistics.median(residual[:k])
    step = statistics.median(residual[k:]) - base if k < len(residual) else 0.0
    before = residual[:k]
    noise = MAD_TO_SIGMA * statistics.median(abs(v - base) for v in before)
    start = statistics.median(residual[:recent])
    if clean:  # the same fit, on buckets known to hold no leak
        start = min(start, statistics.median(
            b.level - sum(c * x for c, x in zip(coef, _features(b, 0.0), strict=True))
            for b in clean))
    return Unexplained(
        now=now, base=base, rise=now - base,
        leaked=statistics.fmean(residual[-latest:]) - min(base, start), z=z,
        split_t=usable[k].t if k < len(usable) else None,
        still_up=step > 0 and now - base >= step / 2,
        explained_now=statistics.fmean(explained[-recent:]),
        in_flight_now=statistics.fmean(b.in_flight for b in usable[-recent:]),
        per_token=coef[0], noise=noise, buckets=len(usable), lost_tokens=lost)


def _features(bucket: LoadBucket, lost: float) -> list[float]:
    return [bucket.in_flight + lost, bucket.running, bucket.shared, bucket.prompt_rate,
            bucket.deferred]


def _fit_changes(levels: list[float], rows: list[list[float]]) -> list[float]:
    """Blocks per unit of each feature, from consecutive buckets' changes by least squares
    with an intercept (a steady leak's pace), refitted once without the changes the first
    fit leaves more than TRIM_SIGMAS robust σ away (lumps, bursts the load missed)."""
    d_level = [b - a for a, b in pairwise(levels)]
    d_rows = [[x1 - x0 for x0, x1 in zip(r0, r1, strict=True)]
              for r0, r1 in pairwise(rows)]
    coef = _least_squares(d_rows, d_level)
    misses = [y - _predict(coef, x) for x, y in zip(d_rows, d_level, strict=True)]
    spread = MAD_TO_SIGMA * statistics.median(abs(m) for m in misses)
    kept = [i for i, m in enumerate(misses) if abs(m) <= TRIM_SIGMAS * spread] if spread else []
    if len(kept) > len(rows[0]) + 1 and len(kept) < len(misses):
        coef = _least_squares([d_rows[i] for i in kept], [d_level[i] for i in kept])
    return coef[1:]  # the intercept is the leak's pace, not the load's


def _least_squares(rows: list[list[float]], ys: list[float]) -> list[float]:
    """[intercept, *blocks per unit of each feature] in the features' own units: solved on
    centred, scaled features with leak_estimate's tiny ridge (a feature that never moves,
    such as deferred requests where none are, gets 0)."""
    n, width = len(rows), len(rows[0])
    columns = [list(col) for col in zip(*rows, strict=True)]
    means = [sum(col) / n for col in columns]
    spreads = [math.sqrt(sum((v - m) ** 2 for v in col) / n) or 1.0
               for col, m in zip(columns, means, strict=True)]
    scaled = [[1.0] * n] + [[(v - m) / s for v in col]
                            for col, m, s in zip(columns, means, spreads, strict=True)]
    ata = [[sum(map(operator.mul, a, b)) for b in scaled] for a in scaled]
    aty = [sum(map(operator.mul, a, ys)) for a in scaled]
    solved = _ridge_solve(ata, aty) or [0.0] * (width + 1)
    slopes = [c / s for c, s in zip(solved[1:], spreads, strict=True)]
    intercept = solved[0] - sum(c * m for c, m in zip(slopes, means, strict=True))
    return [intercept, *slopes]


def _predict(coef: list[float], row: list[float]) -> float:
    return coef[0] + sum(c * x for c, x in zip(coef[1:], row, strict=True))


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
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
