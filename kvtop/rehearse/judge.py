"""The rehearsal's judgement: three criteria, the verdict rule and the advice table.

Every rule and number here is documented in docs/rehearse.md; the report cites the figures
behind each state. The run under load is split into thirds and twelve windows (target time):

* **GPU memory stable** - per GPU, the median memory used in the last third against the
  first; *fail* when it rose by more than max(1 % of the GPU, 512 MiB) and the Theil-Sen
  trend over the windows is rising (99 % lower bound above 0).
* **free KV not falling** - the leak detector (the app's, on every scrape) and the idle
  floor before the load against after it; *fail* on a LEAK verdict or when more blocks stay
  used at idle after the run than before (beyond the detector's residual threshold).
* **slow-request share not rising** - a request is slow when it failed, was dropped, or its
  TTFT or time per output token is above its class's 90th percentile in the first third
  (one cut by the end of the run counts once it had waited that long for its first token);
  *fail* when the last third's share is 10 points above the first's, a one-sided
  two-proportion test agrees (z >= 2.33) and the rise holds to the end (a sign test: each
  window of the last third above the first third's share, three of its four at least).

Verdict: NO-GO when two criteria fail (any one with ``--strict``), or when more than
``max_error_rate`` of the requests failed; a criterion that could not be judged never counts
as failed, and the report says so.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

from kvtop.derive.leak import LeakParams, median, theil_sen
from kvtop.derive.quantiles import quantile as histogram_quantile
from kvtop.derive.samples import percentile
from kvtop.derive.tracker import EngineKey
from kvtop.derive.verdicts import VERDICT_RANK
from kvtop.derive.verdicts import Verdict as CheckVerdict
from kvtop.rehearse.requests import CODE, RequestTable
from kvtop.rehearse.watch import EnginePoint, GpuPoint, WatchData

State = Literal["ok", "watch", "fail", "not_judged"]
Verdict = Literal["go", "no-go", "no-verdict"]

WINDOWS = 12
Z = 2.33  # one-sided 99 %: the two-proportion test and the trend's lower bound
Z_WATCH = 1.64  # one-sided 95 %
LAST_WINDOWS = range(WINDOWS * 2 // 3, WINDOWS)  # the last third's windows
MIN_PER_THIRD = 30  # requests (or histogram observations) in each compared third
MIN_PER_WINDOW = 5
MIN_CLASS = 20  # answered requests of a class in the first third for its own thresholds
SLOW_QUANTILE = 0.9
SLOW_RISE_FAIL = 0.10  # share points
SLOW_RISE_WATCH = 0.05
GPU_RISE_FRAC = 0.01
GPU_RISE_MIN_BYTES = 512 * 2**20
GPU_MIN_POINTS = 3  # per third
PINNED_USAGE = 0.95
PINNED_SHARE = 0.25  # of the scrapes under load, for "the pool is pinned"
LONG_PROMPT_FRAC = 0.25  # prompt p90 / context length from which prompts count as long
PREEMPTIONS_PER_MIN = 1.0
HIT_RATE_SHORTFALL = 0.5  # hit rate below this share of the workload's expected one
DEFAULT_MAX_ERROR_RATE = 0.01
GIB = 2**30


@dataclass
class Criterion:
    name: str
    title: str
    state: State
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Span:
    """The load phase, in target seconds since the start."""

    start: float
    end: float

    @property
    def length(self) -> float:
        return max(self.end - self.start, 1e-9)

    def third(self, t: float) -> int:
        return min(2, max(0, int(3 * (t - self.start) / self.length)))

    def window(self, t: float) -> int:
        return min(WINDOWS - 1, max(0, int(WINDOWS * (t - self.start) / self.length)))

    def window_hours(self, index: int) -> float:
        return (index + 0.5) * self.length / WINDOWS / 3600

    def holds(self, t: float) -> bool:
        return self.start <= t <= self.end


# ------------------------------------------------------------------------- latency


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
        "slow_thresholds": {table.classes[c]: {"ttft_s": _round(v[0]), "tpot_s": _round(v[1])}
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
    return {name: {f"p{int(q * 100)}": _round(percentile(thirds[k], q)) for q in (0.5, 0.9, 0.99)}
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
    figures = {"ttft_s": {name: {f"p{int(q * 100)}": _round(histogram_quantile(q, b))
                                 for q in (0.5, 0.9, 0.99)} if b else None
                          for name, b in (("first", first), ("last", last))},
               "slow_thresholds": {"all": {"ttft_s": _round(bound)}},
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
        return Criterion("latency", TITLES["latency"], "not_judged",
                         f"too few {unit} to compare: {n1:.0f} in the first third, {n3:.0f} "
                         f"in the last (needs {MIN_PER_THIRD} each)", figures)
    p1, p3 = shares.share(0) or 0.0, shares.share(2) or 0.0
    z = _two_proportion_z(shares.slow[0], n1, shares.slow[2], n3)
    slope = _window_slope(shares, span)
    held = _held_to_the_end(shares, p1)
    figures.update({"slow_share": {"first": _round(p1, 4), "last": _round(p3, 4),
                                   "windows": [_round(slow / count, 4) if count else None
                                               for slow, count in zip(shares.window_slow,
                                                                      shares.window_count,
                                                                      strict=True)]},
                    "compared": {"first": n1, "last": n3}, "z": _round(z, 2),
                    "trend_per_hour": _round(slope, 4), "held_to_the_end": held})
    rise = p3 - p1
    said = (f"slow {unit} {p1:.1%} in the first third, {p3:.1%} in the last (z {z:.1f}; "
            f"{'above' if held else 'not above'} the first third in every window of the "
            f"last; trend {_signed(slope)}/h)")
    if rise >= SLOW_RISE_FAIL and z >= Z and held:
        return Criterion("latency", TITLES["latency"], "fail", "rising: " + said, figures)
    if rise >= SLOW_RISE_WATCH and z >= Z_WATCH:
        return Criterion("latency", TITLES["latency"], "watch", "creeping up: " + said, figures)
    return Criterion("latency", TITLES["latency"], "ok", "not rising: " + said, figures)


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


# ------------------------------------------------------------------------- GPU memory


def judge_gpu(points: list[GpuPoint], span: Span, unavailable: str | None) -> Criterion:
    by_gpu: dict[int, list[GpuPoint]] = defaultdict(list)
    for point in points:
        if span.holds(point.t):
            by_gpu[point.index].append(point)
    if not by_gpu:
        why = unavailable or "no GPU memory readings under load"
        return Criterion("gpu_memory", TITLES["gpu_memory"], "not_judged",
                         f"not judged: {why}")
    results = [_one_gpu(index, series, span) for index, series in sorted(by_gpu.items())]
    judged = [r for r in results if r[0] != "not_judged"]
    figures = {"gpus": [r[2] for r in results]}
    if not judged:
        return Criterion("gpu_memory", TITLES["gpu_memory"], "not_judged",
                         "not judged: too few GPU readings in the first or last third", figures)
    worst = max(judged, key=lambda r: _RANK[r[0]])
    return Criterion("gpu_memory", TITLES["gpu_memory"], worst[0], worst[1], figures)


# A criterion's states in the order of check's verdicts: none yet, fine, watch, bad.
_AS_VERDICT: dict[State, CheckVerdict] = {"not_judged": "unknown", "ok": "ok", "watch": "watch",
                                         "fail": "leak"}
_RANK = {state: VERDICT_RANK[verdict] for state, verdict in _AS_VERDICT.items()}


def _one_gpu(index: int, series: list[GpuPoint], span: Span
             ) -> tuple[State, str, dict[str, Any]]:
    thirds: list[list[float]] = [[], [], []]
    windows: list[list[float]] = [[] for _ in range(WINDOWS)]
    for point in series:
        thirds[span.third(point.t)].append(point.used)
        windows[span.window(point.t)].append(point.used)
    total = series[-1].total
    figures: dict[str, Any] = {"index": index, "name": series[-1].name,
                               "total_gib": _round(total / GIB, 2)}
    if len(thirds[0]) < GPU_MIN_POINTS or len(thirds[2]) < GPU_MIN_POINTS:
        return "not_judged", f"GPU {index}: too few readings", figures
    first, last = median(thirds[0]), median(thirds[2])
    limit = max(GPU_RISE_FRAC * total, GPU_RISE_MIN_BYTES)
    xs = [span.window_hours(w) for w in range(WINDOWS) if windows[w]]
    ys = [median(windows[w]) for w in range(WINDOWS) if windows[w]]
    slope, lower, _ = theil_sen(xs, ys, Z) if len(xs) >= 3 else (0.0, -math.inf, math.inf)
    rise = last - first
    figures.update({"first_gib": _round(first / GIB, 3), "last_gib": _round(last / GIB, 3),
                    "rise_gib": _round(rise / GIB, 3), "limit_gib": _round(limit / GIB, 3),
                    "trend_gib_per_hour": _round(slope / GIB, 3)})
    said = (f"GPU {index}: {first / GIB:.2f} GiB used in the first third, {last / GIB:.2f} "
            f"in the last ({_signed(rise / GIB, '.2f')} GiB; limit {limit / GIB:.2f})")
    if rise > limit and lower > 0:
        return "fail", "growing: " + said, figures
    if rise > limit / 2 and slope > 0:
        return "watch", "creeping up: " + said, figures
    return "ok", "stable: " + said, figures


# ------------------------------------------------------------------------- free KV


def judge_kv(data: WatchData, params: LeakParams, span: Span) -> Criterion:
    engines = [_one_engine(key, points, data, params, span)
               for key, points in data.points.items()]
    engines = [e for e in engines if e is not None]
    if not engines:
        return Criterion("kv_free", TITLES["kv_free"], "not_judged",
                         "not judged: the server exports no KV block usage")
    worst = max(engines, key=lambda e: _RANK[e[0]])
    figures: dict[str, Any] = {"engines": [e[2] for e in engines]}
    if any(span.holds(t) for t in data.restarts):
        figures["restarted_during_load"] = True
    return Criterion("kv_free", TITLES["kv_free"], worst[0], worst[1], figures)


def _one_engine(key: EngineKey, points: list[EnginePoint], data: WatchData,
                params: LeakParams, span: Span) -> tuple[State, str, dict[str, Any]] | None:
    if not any(p.used is not None for p in points):
        return None
    total = next((p.total for p in reversed(points) if p.total), None)
    before = idle_floor(points, "before")
    after = idle_floor(points, "after")
    threshold = max(params.residual_min_blocks, params.residual_min_frac * (total or 0))
    verdict = data.verdicts.get(key)
    detector = verdict.to_json() if verdict is not None else None
    name = " ".join(part for part in key if part) or "engine"
    figures: dict[str, Any] = {"model": key[0], "engine": key[1], "blocks_total": total,
                               "idle_used_before": _round(before, 1),
                               "idle_used_after": _round(after, 1),
                               "residual_threshold_blocks": _round(threshold, 1),
                               "leak_detector": detector}
    rise = None if before is None or after is None else after - before
    figures["idle_used_rise"] = _round(rise, 1)
    floor = (f"{before:.0f} blocks used at idle before the load, {after:.0f} after"
             if rise is not None else _why_no_floor(before, after))
    state = detector["verdict"] if detector else "unknown"
    said = f"{name}: leak detector {state.upper()} ({detector['reason'] if detector else '-'}); " \
           f"{floor}"
    if state == "leak" or (rise is not None and rise > threshold):
        return "fail", "falling: " + said, figures
    if state == "watch":
        return "watch", "suspect: " + said, figures
    if state == "unknown" and rise is None:
        return "not_judged", "not judged: " + said, figures
    return "ok", "holding: " + said, figures


def idle_floor(points: list[EnginePoint], phase: str) -> float | None:
    """Least blocks used while idle in ``phase``, less the server's idle floor."""
    used = [p.used - p.idle_floor for p in points
            if p.phase == phase and p.idle and p.used is not None]
    return min(used) if used else None


def _why_no_floor(before: float | None, after: float | None) -> str:
    if before is None and after is None:
        return "the server was never idle before or after the load: no floor to compare"
    if before is None:
        return "the server was busy before the load: no floor to compare"
    return "the server did not go idle after the load: no floor to compare"


# ------------------------------------------------------------------------- verdict


TITLES = {"gpu_memory": "GPU memory stable", "kv_free": "free KV not falling",
          "latency": "slow-request share not rising"}


@dataclass
class Judgement:
    verdict: Verdict
    rule: str
    failed: list[str]
    reasons: list[str]


def decide(criteria: list[Criterion], *, strict: bool, error_rate: float | None,
           max_error_rate: float) -> Judgement:
    need = 1 if strict else 2
    rule = (f"NO-GO when {'any one' if strict else 'two'} of the three criteria fail"
            f"{'' if strict else ' (--strict: any one)'}, or more than "
            f"{max_error_rate:.1%} of the requests fail; a criterion not judged never counts")
    failed = [c.name for c in criteria if c.state == "fail"]
    reasons = [f"{TITLES[name]}: failed" for name in failed]
    too_many_errors = error_rate is not None and error_rate > max_error_rate
    if too_many_errors:
        reasons.append(f"{error_rate:.1%} of the requests failed (limit {max_error_rate:.1%})")
    if len(failed) >= need or too_many_errors:
        return Judgement("no-go", rule, failed, reasons)
    judged = [c for c in criteria if c.state != "not_judged" and c.name != "gpu_memory"]
    if not judged:
        return Judgement("no-verdict", rule, failed,
                         ["neither free KV nor latency could be judged"])
    return Judgement("go", rule, failed, reasons)


# ------------------------------------------------------------------------- advice


@dataclass
class Advice:
    lever: str
    action: str
    figures: dict[str, Any]


@dataclass
class LoadFigures:
    """What the server did under load, for the advice table and the report."""

    pinned_share: float | None = None  # scrapes with KV usage >= PINNED_USAGE
    usage_max: float | None = None
    preemptions: float | None = None
    preemptions_per_min: float | None = None
    waiting_p90: float | None = None
    running_max: float | None = None
    hit_rate: float | None = None  # prefix-cache hits / queries under load
    prompt_p90: float | None = None  # tokens, as the server counted them


def load_figures(data: WatchData, span: Span, table: RequestTable | None) -> LoadFigures:
    figures = LoadFigures()
    load = [p for points in data.points.values() for p in points if span.holds(p.t)]
    usages = [p.usage for p in load if p.usage is not None]
    if usages:
        figures.pinned_share = sum(u >= PINNED_USAGE for u in usages) / len(usages)
        figures.usage_max = max(usages)
    waiting = [p.waiting for p in load if p.waiting is not None]
    figures.waiting_p90 = percentile(waiting, 0.9)
    running = [p.running for p in load if p.running is not None]
    figures.running_max = max(running) if running else None
    preempted = _counter_rise(data, span, "preemptions")
    if preempted is not None:
        figures.preemptions = preempted
        figures.preemptions_per_min = preempted / (span.length / 60)
    hits, queries = _counter_rise(data, span, "prefix_hits"), _counter_rise(data, span,
                                                                            "prefix_queries")
    if hits is not None and queries:
        figures.hit_rate = hits / queries
    if table is not None and len(table):
        figures.prompt_p90 = percentile(list(table.prompt), 0.9)
    return figures


def _counter_rise(data: WatchData, span: Span, name: str) -> float | None:
    """A counter's increase over the load, summed over engines; restarts (a drop) count
    from zero."""
    total, seen = 0.0, False
    for points in data.points.values():
        values = [getattr(p, name) for p in points if span.holds(p.t)]
        values = [v for v in values if v is not None]
        for before, now in pairwise(values):
            total += now - before if now >= before else now
            seen = True
    return total if seen else None


def advise(criteria: dict[str, Criterion], figures: LoadFigures, *, model_len: int | None,
           expected_hit_rate: float | None, error_rate: float | None,
           errors: dict[str, int]) -> list[Advice]:
    """The levers the evidence points to (docs/rehearse.md's table), each with its figures.
    A leak explains a pinned pool and the queues behind it, so it stands alone then."""
    out: list[Advice] = []
    kv = criteria.get("kv_free")
    if kv is not None and kv.state == "fail":
        out.append(Advice("leak", "the idle floor rises: a KV leak; record it (kvtop record), "
                          "report it upstream with the recording, restart the server",
                          _leak_figures(kv)))
    else:
        out += _capacity_advice(figures, model_len)
    if (expected_hit_rate and figures.hit_rate is not None
            and figures.hit_rate < HIT_RATE_SHORTFALL * expected_hit_rate):
        out.append(Advice("prefix-caching", "a low hit rate on a shared-prefix workload: "
                          "prefix caching is off (--enable-prefix-caching) or the prompts "
                          "do not share a prefix",
                          {"hit_rate": _round(figures.hit_rate, 3),
                           "expected_hit_rate": _round(expected_hit_rate, 3)}))
    if error_rate:
        common = max(errors.items(), key=lambda kv: kv[1])[0] if errors else None
        out.append(Advice("errors", "requests failed: the server's log says why",
                          {"error_rate": _round(error_rate, 4), "most_common": common}))
    return out


def _capacity_advice(figures: LoadFigures, model_len: int | None) -> list[Advice]:
    long_prompts = (figures.prompt_p90 is not None and model_len is not None
                    and figures.prompt_p90 >= LONG_PROMPT_FRAC * model_len)
    pinned = figures.pinned_share is not None and figures.pinned_share >= PINNED_SHARE
    prompt = {"prompt_p90_tokens": _round(figures.prompt_p90, 0), "max_model_len": model_len}
    if pinned and long_prompts:
        return [Advice("max-model-len", "the pool is pinned by long prompts: lower "
                       "--max-model-len or split long tasks",
                       {"pinned_share": _round(figures.pinned_share, 3), **prompt})]
    queued = ((figures.preemptions_per_min or 0) >= PREEMPTIONS_PER_MIN
              or (figures.waiting_p90 or 0) >= 1)
    if queued:
        return [Advice("max-num-seqs", "queues and preemptions at moderate context: cap "
                       "--max-num-seqs (or the clients' concurrency), or raise "
                       "--gpu-memory-utilization",
                       {"preemptions_per_min": _round(figures.preemptions_per_min, 2),
                        "waiting_p90": _round(figures.waiting_p90, 1),
                        "running_max": figures.running_max, **prompt})]
    return []


def _leak_figures(kv: Criterion) -> dict[str, Any]:
    worst = max(kv.figures.get("engines", []),
                key=lambda e: (e.get("idle_used_rise") or 0), default={})
    detector = worst.get("leak_detector") or {}
    return {"idle_used_before": worst.get("idle_used_before"),
            "idle_used_after": worst.get("idle_used_after"),
            "leak_verdict": detector.get("verdict"),
            "leaked_blocks": detector.get("leaked_blocks"),
            "slope_blocks_per_hour": detector.get("slope_blocks_per_hour")}


# ------------------------------------------------------------------------- helpers


def _round(value: float | None, digits: int = 6) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _signed(value: float | None, fmt: str = ".1%") -> str:
    if value is None:
        return "?"
    return format(value, "+" + fmt)
