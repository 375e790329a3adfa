"""The rehearsal's latency criterion: **slow-request share not rising**.

A request is slow when it failed, was dropped, or its TTFT or time per output token is above
its class's 90th percentile in the first third (one cut by the end of the run counts once it
had waited that long for its first token); *fail* when the last third's share is 10 points
above the first's, a one-sided two-proportion test agrees (z >= 2.33) and the rise holds to
the end (a sign test: each window of the last third above the first third's share, three of
its four at least); *watch* on a rise of 5 points with z >= 1.64. Watch-only runs judge the
server's TTFT histogram the same way (docs/rehearse.md).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from kvtop.derive.quantiles import quantile as histogram_quantile
from kvtop.derive.samples import percentile, theil_sen
from kvtop.rehearse.criteria import TITLES, WINDOWS, Criterion, Span, Z, rounded, signed
from kvtop.rehearse.requests import CODE, RequestTable

Z_WATCH = 1.64  # one-sided 95 %
LAST_WINDOWS = range(WINDOWS * 2 // 3, WINDOWS)  # the last third's windows
MIN_PER_THIRD = 30  # requests (or histogram observations) in each compared third
MIN_PER_WINDOW = 5
MIN_CLASS = 20  # answered requests of a class in the first third for its own thresholds
SLOW_QUANTILE = 0.9
SLOW_RISE_FAIL = 0.10  # share points
SLOW_RISE_WATCH = 0.05


@dataclass
class _Shares:
    """Slow and total counts per third and per window."""

    slow: list[float] = field(default_factory=lambda: [0.0] * 3)
    count: list[float] = field(default_factory=lambda: [0.0] * 3)
    window_slow: list[float] = field(default_factory=lambda: [0.0] * WINDOWS)
    window_count: list[float] = field(default_factory=lambda: [0.0] * WINDOWS)

    def add(self, span: Span, t: float, slow: float, count: float = 1.0) -> None:
        third, window = span.third(t), span.window(t)
        self.slow[third] += slow
        self.count[third] += count
        self.window_slow[window] += slow
        self.window_count[window] += count

    def share(self, third: int) -> float | None:
        return self.slow[third] / self.count[third] if self.count[third] else None


def judge_latency(table: RequestTable, span: Span) -> Criterion:
    """From the client's timings of first attempts (retries and cut requests left out)."""
    thresholds = _slow_thresholds(table, span)
    shares = _Shares()
    for i in range(len(table)):
        if not span.holds(table.t[i]):
            continue
        slow = _slow(table, i, thresholds)
        if slow is not None:
            shares.add(span, table.t[i], 1.0 if slow else 0.0)
    figures: dict[str, Any] = {
        "ttft_s": _thirds_quantiles(table, table.ttft, span),
        "tpot_s": _thirds_quantiles(table, table.tpot, span),
        "total_s": _thirds_quantiles(table, table.total, span),
        "slow_thresholds": {table.classes[c]: {"ttft_s": rounded(v[0]), "tpot_s": rounded(v[1])}
                            for c, v in thresholds.items()},
    }
    return _rising("requests", shares, span, figures)


def _slow_thresholds(table: RequestTable, span: Span) -> dict[int, tuple[float, float]]:
    """Per class, the first third's 90th percentiles of TTFT and of time per output
    token (classes with few answers share the thresholds of all requests)."""
    ttfts: dict[int, list[float]] = defaultdict(list)
    tpots: dict[int, list[float]] = defaultdict(list)
    ok = CODE["ok"]
    for i in range(len(table)):
        if table.outcome[i] != ok or not span.holds(table.t[i]) or span.third(table.t[i]):
            continue
        if not math.isnan(table.ttft[i]):
            ttfts[table.cls[i]].append(table.ttft[i])
        if not math.isnan(table.tpot[i]):
            tpots[table.cls[i]].append(table.tpot[i])
    pooled = (_q90([v for vs in ttfts.values() for v in vs]),
              _q90([v for vs in tpots.values() for v in vs]))
    return {c: (_q90(ttfts[c]), _q90(tpots[c])) if len(ttfts[c]) >= MIN_CLASS else pooled
            for c in range(len(table.classes))}


def _q90(values: list[float]) -> float:
    found = percentile(values, SLOW_QUANTILE)
    return math.inf if found is None else found


def _slow(table: RequestTable, i: int, thresholds: dict[int, tuple[float, float]]
          ) -> bool | None:
    """Whether request i was slow; None for a request cut by the end of the run before
    anything showed it (no first token, and it had not yet waited past the threshold)."""
    ttft_limit, tpot_limit = thresholds[table.cls[i]]
    outcome = table.outcome[i]
    if outcome == CODE["cut"]:
        if not math.isnan(table.ttft[i]):
            return table.ttft[i] > ttft_limit
        return True if table.total[i] > ttft_limit else None
    if outcome != CODE["ok"]:
        return True  # failed, timed out or dropped
    return table.ttft[i] > ttft_limit or table.tpot[i] > tpot_limit  # NaN compares False


def _thirds_quantiles(table: RequestTable, column: Iterable[float],
                      span: Span) -> dict[str, dict[str, float | None]]:
    thirds: list[list[float]] = [[], [], []]
    ok = CODE["ok"]
    for i, value in enumerate(column):
        if table.outcome[i] == ok and not math.isnan(value) and span.holds(table.t[i]):
            thirds[span.third(table.t[i])].append(value)
    return {name: {f"p{int(q * 100)}": rounded(percentile(thirds[k], q)) for q in (0.5, 0.9, 0.99)}
            for k, name in ((0, "first"), (2, "last"))}


def judge_latency_histograms(ttft: list[tuple[float, list[tuple[float, float]]]],
                             span: Span) -> Criterion:
    """Watch-only: from the server's TTFT histogram; a request is slow when its TTFT lies
    above the bucket bound at or over the first third's 90th percentile."""
    deltas = _histogram_deltas(ttft, span)
    first = _add_buckets(d for t, d in deltas if span.third(t) == 0)
    estimate = histogram_quantile(SLOW_QUANTILE, first) if first else None
    if estimate is None:
        return Criterion("latency", TITLES["latency"], "not_judged",
                         "the server exported no TTFT observations in the first third")
    bound = next(b for b, _ in first if b >= estimate)
    shares = _Shares()
    for t, buckets in deltas:
        total = buckets[-1][1]
        within = next((c for b, c in buckets if b == bound), total)
        shares.add(span, t, total - within, total)
    last = _add_buckets(d for t, d in deltas if span.third(t) == 2)
    figures = {"ttft_s": {name: {f"p{int(q * 100)}": rounded(histogram_quantile(q, b))
                                 for q in (0.5, 0.9, 0.99)} if b else None
                          for name, b in (("first", first), ("last", last))},
               "slow_thresholds": {"all": {"ttft_s": rounded(bound)}},
               "source": "the server's TTFT histogram"}
    return _rising("observations", shares, span, figures)


def _histogram_deltas(ttft: list[tuple[float, list[tuple[float, float]]]], span: Span
                      ) -> list[tuple[float, list[tuple[float, float]]]]:
    """Cumulative buckets observed between consecutive scrapes in the span; after a restart
    (counts fell) the new counts are all new."""
    out = []
    for (_, before), (t, now) in pairwise(ttft):
        if not span.holds(t) or [b for b, _ in before] != [b for b, _ in now]:
            continue
        restarted = now[-1][1] < before[-1][1]
        delta = now if restarted else [(bound, count - previous) for (bound, count), (_, previous)
                                       in zip(now, before, strict=True)]
        if delta[-1][1] > 0:
            out.append((t, delta))
    return out


def _add_buckets(deltas: Iterable[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    total: dict[float, float] = {}
    for buckets in deltas:
        for bound, count in buckets:
            total[bound] = total.get(bound, 0.0) + count
    return sorted(total.items())


def _rising(unit: str, shares: _Shares, span: Span, figures: dict[str, Any]) -> Criterion:
    n1, n3 = shares.count[0], shares.count[2]
    if n1 < MIN_PER_THIRD or n3 < MIN_PER_THIRD:
        figures["needs"] = _latency_needs(unit, min(n1, n3), span)
        return Criterion("latency", TITLES["latency"], "not_judged",
                         f"too few {unit} to compare: {n1:.0f} in the first third, {n3:.0f} "
                         f"in the last (needs {MIN_PER_THIRD} each): {figures['needs']}",
                         figures)
    p1, p3 = shares.share(0) or 0.0, shares.share(2) or 0.0
    z = _two_proportion_z(shares.slow[0], n1, shares.slow[2], n3)
    slope = _window_slope(shares, span)
    held = _held_to_the_end(shares, p1)
    figures.update({"slow_share": {"first": rounded(p1, 4), "last": rounded(p3, 4),
                                   "windows": [rounded(slow / count, 4) if count else None
                                               for slow, count in zip(shares.window_slow,
                                                                      shares.window_count,
                                                                      strict=True)]},
                    "compared": {"first": n1, "last": n3}, "z": rounded(z, 2),
                    "trend_per_hour": rounded(slope, 4), "held_to_the_end": held})
    rise = round(p3 - p1, 9)  # ten points are ten points, whatever the float's last digit
    said = (f"slow {unit} {p1:.1%} in the first third, {p3:.1%} in the last (z {z:.1f}; "
            f"{'above' if held else 'not above'} the first third in every window of the "
            f"last; trend {signed(slope)}/h)")
    if rise >= SLOW_RISE_FAIL and z >= Z and held:
        return Criterion("latency", TITLES["latency"], "fail", "rising: " + said, figures)
    if rise >= SLOW_RISE_WATCH and z >= Z_WATCH:
        return Criterion("latency", TITLES["latency"], "watch", "creeping up: " + said, figures)
    return Criterion("latency", TITLES["latency"], "ok", "not rising: " + said, figures)


def _latency_needs(unit: str, fewest: float, span: Span) -> str:
    """How much longer the load must run for each third to hold MIN_PER_THIRD, at the rate
    the sparser third saw."""
    if fewest <= 0:
        return f"needs {unit} in every third of the load; none came in one"
    per_s = fewest / (span.length / 3)
    more = 3 * MIN_PER_THIRD / per_s - span.length
    return (f"needs about {math.ceil(more / 60)} more minutes of load at this rate "
            f"({per_s * 60:.1f} {unit}/min in the sparser third)")


def _two_proportion_z(slow1: float, n1: float, slow3: float, n3: float) -> float:
    pooled = (slow1 + slow3) / (n1 + n3)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n3))
    diff = slow3 / n3 - slow1 / n1
    if se == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / se


def _window_slope(shares: _Shares, span: Span) -> float | None:
    """Theil-Sen slope of the windows' slow shares, per hour (a figure for the report)."""
    xs = [span.window_hours(w) for w in range(WINDOWS)
          if shares.window_count[w] >= MIN_PER_WINDOW]
    ys = [shares.window_slow[w] / shares.window_count[w] for w in range(WINDOWS)
          if shares.window_count[w] >= MIN_PER_WINDOW]
    return theil_sen(xs, ys, Z)[0] if len(xs) >= 3 else None


def _held_to_the_end(shares: _Shares, first_share: float) -> bool:
    """The trend test: a sign test over the last third's windows, each above the first
    third's share (p = 1/16 for four windows if nothing changed, 1/8 for three; a window
    with too few requests to say is left out, at most one). A rise that plateaus or ends in
    failures passes; one bad stretch does not."""
    windows = [w for w in LAST_WINDOWS if shares.window_count[w] >= MIN_PER_WINDOW]
    return len(windows) >= len(LAST_WINDOWS) - 1 and all(
        shares.window_slow[w] / shares.window_count[w] > first_share for w in windows)
