"""Per-engine KV-leak detector: says "leak" early on a real leak, stays quiet on a busy pool.

Three kinds of evidence (method and parameters: docs/leak-detector.md):

* **idle residual** - blocks still used while nothing runs, counted directly;
* **rising floor** - the per-bucket minimum of used blocks trending up (Theil–Sen with a
  confidence bound) beyond what the load explains, once the batch has turned over;
* **consequences** - queue growth at flat throughput, more preemptions at the same load, a
  pinned pool losing running requests: they only confirm a rising floor, never alone.

A scrape whose used blocks sit at the idle floor proves that nothing has leaked so far and
clears the evidence; a restart resets it. Memory is bounded by the trend window's buckets.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise

from kvtop.derive.leak_estimate import LeakFit, LoadPoint, fit_leak, leaked_now
from kvtop.derive.leak_load import LoadBucket, Unexplained, best_split, explain
from kvtop.derive.stats import EngineStats
from kvtop.derive.verdicts import LEAK_RANK as _RANK
from kvtop.derive.verdicts import LeakState, LeakVerdict


@dataclass(frozen=True)
class LeakParams:
    """Every threshold of :class:`LeakDetector`; docs/leak-detector.md says why each default."""

    bucket_s: float = 60.0  # floor = min of used blocks per bucket of this length
    window_s: float = 1800.0  # trend window (buckets kept); bounds memory and the slope's lag
    max_gap_s: float = 120.0  # a longer silence between scrapes breaks an idle run
    idle_min_s: float = 20.0  # an idle run counts once it spans this long...
    idle_min_scrapes: int = 3  # ...over at least this many scrapes (step-end stats lag)
    idle_leak_s: float = 60.0  # a residual held this long at idle (or twice) is a LEAK
    residual_min_blocks: float = 2.0  # blocks above the idle floor that count as held
    residual_min_frac: float = 0.001  # ...or this fraction of the pool, the larger
    trend_min_buckets: int = 10  # buckets needed before the floor trend is judged
    trend_min_span_s: float = 600.0  # and the time they must span
    z: float = 2.33  # one-sided 99 % normal quantile for the Theil–Sen lower bound
    watch_rise_frac: float = 0.01  # adjusted floor rise (of the pool) for WATCH
    leak_rise_frac: float = 0.015  # and for LEAK
    max_hours_to_full: float = 24.0  # slower trends are not the kind this detector reports
    max_load_share: float = 0.5  # the load may explain at most this share of the floor slope
    turnover_min: float = 3.0  # finished requests in the window / most running, at least
    leak_persist_s: float = 300.0  # a rising floor must hold this long to become LEAK...
    support_persist_s: float = 180.0  # ...or this long with a consequence alongside
    floor_grace_s: float = 180.0  # a floor evidence gap shorter than this keeps its age
    leak_hold_s: float = 1800.0  # LEAK stays this long after its last evidence
    watch_hold_s: float = 600.0  # WATCH likewise
    ref_buckets: int = 5  # buckets behind "the level now", "at the start", "lately"
    pinned_frac: float = 0.95  # usage counted as a full pool
    history_s: float = 3600.0  # buckets kept before the floor evidence: the leak's baseline
    estimate_buckets: int = 4  # latest buckets averaged into the leaked-block estimate
    step_z: float = 3.5  # a lump: the level after a split above the level before, this sure
    step_min_buckets: int = 5  # buckets on each side of the split
    explain_window_s: float = 3600.0  # the level the load does not explain: over this long
    explain_min_buckets: int = 15  # usable buckets (no preemption, not pinned) it needs
    explain_z: float = 3.5  # its step up (before/after split), at least this sure
    explain_noise: float = 2.0  # and at least this many times its own noise


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def theil_sen(xs: list[float], ys: list[float], z: float) -> tuple[float, float, float]:
    """(slope, lower, upper): median pairwise slope and Sen's distribution-free bounds."""
    n = len(xs)
    slopes = []
    for i in range(n - 1):  # every pair once; one list per i is faster than one generator
        xi, yi = xs[i], ys[i]
        slopes += [(y - yi) / (x - xi) for x, y in zip(xs[i + 1:], ys[i + 1:], strict=True)
                   if x != xi]
    slopes.sort()
    if not slopes:
        return 0.0, -math.inf, math.inf
    count = len(slopes)
    # Kendall's S variance (no ties) gives how many ranked slopes the bound spans.
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    low = math.floor((count - c) / 2)
    high = math.ceil((count + c) / 2)
    lower = slopes[low] if low >= 0 else -math.inf
    upper = slopes[high] if high < count else math.inf
    return median(slopes), lower, upper


@dataclass(slots=True)
class _Bucket:
    """One bucket's summary: the floor and the load and counts behind it."""

    index: int
    t: float  # time of the floor
    floor: float
    used_max: float
    first: bool = False  # first after a reset: partial, rates still warming up
    used_sum: float = 0.0
    scrapes: int = 0
    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    seconds: float = 0.0  # scrape windows summed, for counts from rates
    finished: float | None = None
    tokens: float | None = None  # prompt + generated tokens processed
    generated: float | None = None
    preemptions: float | None = None
    in_flight: list[float] = field(default_factory=list)  # tokens in flight per scrape
    deferred: float = 0.0  # waiting requests deferred, summed over scrapes
    aborted: float = 0.0  # requests aborted
    prompt: float = 0.0  # prompt tokens
    prefix_queries: float = 0.0  # prefix-cache lookups and hits, tokens
    prefix_hits: float = 0.0

    def add(self, t: float, used: float, stats: EngineStats) -> None:
        if used < self.floor:
            self.t, self.floor = t, used
        self.used_max = max(self.used_max, used)
        self.used_sum += used
        self.scrapes += 1
        if stats.running is not None:
            self.running.append(stats.running)
        if stats.waiting is not None:
            self.waiting.append(stats.waiting)
        if stats.tokens_in_flight is not None:
            self.in_flight.append(stats.tokens_in_flight)
        self.deferred += stats.waiting_deferred or 0.0
        dt = stats.window_s
        if not dt or dt <= 0:
            return
        self.seconds += dt
        if stats.finished_per_s:
            self.finished = (self.finished or 0.0) + sum(stats.finished_per_s.values()) * dt
        if stats.prompt_tps is not None and stats.generation_tps is not None:
            self.tokens = (self.tokens or 0.0) + (stats.prompt_tps + stats.generation_tps) * dt
        if stats.generation_tps is not None:
            self.generated = (self.generated or 0.0) + stats.generation_tps * dt
        if stats.preemptions_per_s is not None:
            self.preemptions = (self.preemptions or 0.0) + stats.preemptions_per_s * dt
        self.aborted += (stats.finished_per_s or {}).get("abort", 0.0) * dt
        self.prompt += (stats.prompt_tps or 0.0) * dt
        if stats.prefix_queries_per_s and stats.hit_rate is not None:
            self.prefix_queries += stats.prefix_queries_per_s * dt
            self.prefix_hits += stats.hit_rate * stats.prefix_queries_per_s * dt


@dataclass(frozen=True, slots=True)
class _Trend:
    """The rising-floor analysis of the buckets in the window."""

    slope: float  # load-adjusted floor, blocks per hour
    lower: float  # its lower confidence bound
    raw_slope: float  # the floor's own slope
    load_slope: float  # the load's slope, in load units per hour
    per_load: float  # blocks per unit of load (robust ratio)
    rise: float  # adjusted level now minus at the window's start, blocks
    floor_now: float
    turnover: float | None  # finished / most running (recent part x turnover_min); None: unknown
    load_measure: str  # "tokens", "running" or "none"
    consequences: tuple[str, ...]
    step: float = 0.0  # a lump: adjusted level after the split minus before, blocks (0: none)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class LeakDetector:
    """Feed one :class:`EngineStats` per scrape, in time order; read :attr:`verdict`."""

    def __init__(self, params: LeakParams | None = None) -> None:
        self.params = params or LeakParams()
        self._total: float | None = None
        self._in_blocks = True
        self._verdict = LeakVerdict("warmup", "no scrape yet", None, None, None, {})
        self._reset(None, "no scrape yet")

    @property
    def verdict(self) -> LeakVerdict:
        return self._verdict

    def _reset(self, t: float | None, why: str) -> None:
        maxlen = int(self.params.window_s // self.params.bucket_s) + 1
        self._buckets: deque[_Bucket] = deque(maxlen=maxlen)
        self._onset: tuple[float, float] | None = None  # (t, rise) when floor evidence began
        self._trend: _Trend | None = None
        self._pinned_since: float | None = None  # the window has been pinned full since
        self._floor_since: float | None = None
        self._floor_last: float | None = None
        self._idle_start: float | None = None
        self._idle_n = 0
        self._idle_min = math.inf
        self._idle_waiting = 0.0
        self._residuals: deque[tuple[float, float]] = deque(maxlen=16)  # confirmed idle
        self._residual_long = False  # a residual held idle_leak_s, or in two idle runs
        self._leak_last: float | None = None
        self._watch_last: float | None = None
        self._clean_t: float | None = None
        self._last_t: float | None = None
        self._evidence_seen: tuple[float, str] | None = None  # last WATCH/LEAK evidence
        self._leaked_peak: float | None = None  # largest estimate while WATCH/LEAK
        # Closed buckets for the leaked-block estimate; frozen at the floor evidence's onset
        # (the anchor: the baseline before the leak) and refitted at each bucket close.
        self._history: deque[LoadPoint] = deque(maxlen=int(self.params.history_s
                                                            // self.params.bucket_s))
        self._anchor: tuple[LoadPoint, ...] | None = None
        self._fit: LeakFit | None = None
        # Closed buckets with tokens in flight, and the level their load does not explain.
        self._load: deque[LoadBucket] = deque(maxlen=int(self.params.explain_window_s
                                                         // self.params.bucket_s))
        self._unexplained: Unexplained | None = None
        self._clean_load: list[LoadBucket] = []  # before the last clean point, if any
        self._explain_since: float | None = None
        self._explain_last: float | None = None
        self._reset_t, self._reset_why = t, why

    def update(self, stats: EngineStats) -> LeakVerdict:
        """Fold one scrape in and return the verdict after it."""
        pool = _pool(stats)
        if stats.restarted:
            self._reset(stats.t, "server restarted: evidence reset")
        if pool is None:
            return self._verdict
        used, total, in_blocks = pool
        if total != self._total:
            if self._total is not None:
                self._reset(stats.t, "pool size changed: evidence reset")
            self._total, self._in_blocks = total, in_blocks
        # The floor comes from the server's version (the adapter), never from an idle pool:
        # an idle period after a leak has begun already holds leaked blocks.
        floor = stats.idle_floor_blocks if in_blocks else 0.0
        self._floor_note = "" if stats.idle_floor_exact or not in_blocks else (
            f" (idle floor {floor:.0f} block{'s' if floor != 1 else ''} assumed: "
            "server version not known exactly)")
        residual = max(0.0, used - floor)
        if residual <= self._threshold():
            # The latest usable buckets before a clean point held no leak: the baseline of
            # the leaked-block estimate, should a leak begin right after it.
            clean = [b for b in self._load if b.usable]
            clean = clean or self._clean_load
            self._reset(stats.t, "pool drained to its idle floor: nothing leaked so far")
            self._clean_t = stats.t
            self._clean_load = clean
        self._track_idle(stats, residual)
        self._add_to_bucket(stats, used)
        self._last_t = stats.t
        self._verdict = self._decide(stats.t, used)
        return self._verdict

    def _threshold(self) -> float:
        p, total = self.params, self._total or 0.0
        return max(p.residual_min_blocks if self._in_blocks else 0.0, p.residual_min_frac * total)

    # -- idle residual -------------------------------------------------------------------
    def _track_idle(self, stats: EngineStats, residual: float) -> None:
        p, t = self.params, stats.t
        # Nothing running means no live request holds blocks: waiting requests hold none
        # (V1 frees on preemption). A pool full of leaked blocks with requests stuck in
        # the queue is the end state of a leak, so waiting > 0 still counts.
        idle = stats.running == 0
        self._idle_waiting = stats.waiting or 0.0
        if not idle or residual <= self._threshold():
            self._idle_start = None
            return
        gap = t - self._last_t if self._last_t is not None else math.inf
        if self._idle_start is None or gap > p.max_gap_s:
            self._idle_start, self._idle_n, self._idle_min = t, 0, math.inf
        self._idle_n += 1
        self._idle_min = min(self._idle_min, residual)
        span = t - self._idle_start
        if self._idle_n < p.idle_min_scrapes or span < p.idle_min_s:
            return
        earlier = [r for r in self._residuals if r[0] < self._idle_start]
        # A residual in a second idle run, or held idle_leak_s, is no step-end straggler.
        self._residual_long |= bool(earlier) or span >= p.idle_leak_s
        self._residuals = deque([*earlier, (t, self._idle_min)], maxlen=self._residuals.maxlen)

    # -- rising floor --------------------------------------------------------------------
    def _add_to_bucket(self, stats: EngineStats, used: float) -> None:
        index = math.floor(stats.t / self.params.bucket_s)
        if self._buckets and self._buckets[-1].index == index:
            self._buckets[-1].add(stats.t, used, stats)
            return
        if self._buckets:
            self._close_bucket(stats.t)
        horizon = index - self._buckets.maxlen if self._buckets.maxlen else index
        while self._buckets and self._buckets[0].index <= horizon:
            self._buckets.popleft()  # gone out of the window across a gap in the scrapes
        bucket = _Bucket(index, stats.t, used, used, first=not self._buckets)
        bucket.add(stats.t, used, stats)
        self._buckets.append(bucket)

    def _close_bucket(self, t: float) -> None:
        """A bucket ended: redo the trend, the floor evidence's age and the leak fit."""
        closed = [b for b in self._buckets if not b.first]
        if closed:
            self._history.append(_load_point(closed, self.params))
            self._explain(t, closed)
        trend = self._analyse(closed)
        if trend is None and self._pinned_since is not None:
            # A pinned pool's level says nothing either way: evidence found before it
            # filled stands (a leak ends by filling the pool), none starts while it is full.
            if self._floor_since is not None:
                self._floor_last = t
        else:
            self._trend = trend
            if trend is not None:
                self._update_floor(t, trend)
        self._refit()

    def _update_floor(self, t: float, trend: _Trend) -> None:
        if self._floor_ok(trend):
            if self._floor_since is None:
                self._floor_since, self._onset = t, (t, trend.rise)
            if self._anchor is None:
                self._anchor = tuple(self._history)
            self._floor_last = t
        elif self._floor_last is None or t - self._floor_last > self.params.floor_grace_s:
            self._floor_since = self._onset = None

    def _explain(self, t: float, closed: list[_Bucket]) -> None:
        """Add the bucket just closed to the load-explained level and judge it. A bucket
        without tokens in flight at every scrape starts the level over; one the ledger
        cannot speak for (a preemption, a full pool) keeps standing evidence, starts none."""
        p = self.params
        point = _load_bucket(closed, p, self._total or 1.0)
        if point is None:
            self._load.clear()
            self._unexplained = None
        else:
            self._load.append(point)
            self._unexplained = explain(self._load, p.ref_buckets, p.step_min_buckets,
                                        p.explain_min_buckets, self._clean_load,
                                        p.estimate_buckets)
        found = self._unexplained
        if point is not None and point.usable and found is not None and self._explained(found):
            self._explain_since = self._explain_since or t
            self._explain_last = t
        elif point is not None and not point.usable and self._explain_since is not None:
            self._explain_last = t
        elif self._explain_last is None or t - self._explain_last > p.floor_grace_s:
            self._explain_since = None

    def _explained(self, found: Unexplained) -> bool:
        """WATCH-level evidence: the unexplained level stepped up surely, is still up, and
        by more than WATCH's rise and its own noise."""
        p, total = self.params, self._total or 1.0
        return (found.z >= p.explain_z and found.still_up
                and found.rise >= p.watch_rise_frac * total
                and found.rise >= p.explain_noise * found.noise)

    def _refit(self) -> None:
        """Separate the leak from the load over the anchor and the buckets since (only for
        the floor's estimate: with tokens in flight the estimate is the unexplained level)."""
        wanted = self._anchor is not None and not self._load
        self._fit = fit_leak(self._fit_points()) if wanted else None

    def _fit_points(self) -> list[LoadPoint]:
        anchor = list(self._anchor or ())
        end = anchor[-1].t if anchor else -math.inf
        return anchor + [p for p in self._history if p.t > end]

    def _analyse(self, all_buckets: list[_Bucket]) -> _Trend | None:
        p = self.params
        if not self._enough(all_buckets):
            self._pinned_since = None
            return None
        loads, measure = _loads(all_buckets, p.ref_buckets)
        # A bucket spent pinned full is censored: its level is the pool's size, whatever the
        # working set and the leak, and "level − k × load" rises whenever the load the
        # finished requests suggest falls (overload: short requests finish, long ones are
        # preempted). Such buckets carry no floor evidence either way.
        cap = p.pinned_frac * (self._total or 1.0)
        kept = [i for i, b in enumerate(all_buckets) if b.used_sum / b.scrapes < cap]
        buckets, loads = [all_buckets[i] for i in kept], [loads[i] for i in kept]
        if not self._enough(buckets):
            self._pinned_since = self._pinned_since or all_buckets[-1].t
            return None
        self._pinned_since = None
        floors = [b.used_sum / b.scrapes for b in buckets]  # bucket level, see docs
        xs = [(b.t - buckets[0].t) / 3600 for b in buckets]
        per_load = _per_load(floors, loads, p.z)
        adjusted = [f - per_load * load for f, load in zip(floors, loads, strict=True)]
        slope, lower, _ = theil_sen(xs, adjusted, p.z)
        raw_slope = theil_sen(xs, floors, p.z)[0]
        load_slope = theil_sen(xs, loads, p.z)[0]
        refs = buckets[-p.ref_buckets:]
        floor_now = median([b.floor for b in refs])
        # Rise within the window: both ends use the same per_load, so load drift cancels.
        rise = median(adjusted[-p.ref_buckets:]) - median(adjusted[:p.ref_buckets])
        # The batch must have turned over in the window and lately, so that the raised level
        # is not the same requests sitting there (a stall, one long generation).
        window, recent = _turnover(buckets), _turnover(refs)
        turnover = None if window is None or recent is None else min(window, p.turnover_min
                                                                          * recent)
        all_xs = [(b.t - all_buckets[0].t) / 3600 for b in all_buckets]
        return _Trend(slope, lower, raw_slope, load_slope, per_load, rise, floor_now,
                      turnover, measure, self._consequences(all_buckets, all_xs),
                      self._step(adjusted, floors))

    def _step(self, adjusted: list[float], levels: list[float]) -> float:
        """A lump: the adjusted level stepped up and stayed up (leaked blocks never come
        back). The split that separates the levels best by a rank test, when it is sure at
        `step_z` (many splits are tried), most of the step is not load, and the latest
        buckets are still up; 0.0 otherwise."""
        p = self.params
        best = best_split(adjusted, p.step_min_buckets)
        if best is None or best[1] < p.step_z:
            return 0.0
        k = best[0]
        before = median(adjusted[:k])
        step = median(adjusted[k:]) - before
        raw_step = median(levels[k:]) - median(levels[:k])
        still_up = median(adjusted[-p.ref_buckets:]) - before >= step / 2
        return step if step >= (1 - p.max_load_share) * max(raw_step, 0.0) and still_up else 0.0

    def _enough(self, buckets: list[_Bucket]) -> bool:
        p = self.params
        return (len(buckets) >= max(p.trend_min_buckets, 3)
                and buckets[-1].t - buckets[0].t >= p.trend_min_span_s)

    def _consequences(self, buckets: list[_Bucket], xs: list[float]) -> tuple[str, ...]:
        p, total = self.params, self._total or 1.0
        found = []
        waiting = [_mean(b.waiting) for b in buckets]
        throughput = [b.generated / b.seconds if b.generated is not None and b.seconds else None
                      for b in buckets]
        if None not in waiting and None not in throughput:
            w_lower = theil_sen(xs, waiting, p.z)[1]
            if w_lower > 0 and theil_sen(xs, throughput, p.z)[0] <= 0:
                found.append("queue growing at flat throughput")
        half = len(buckets) // 2
        early, late = _preempt_rate(buckets[:half]), _preempt_rate(buckets[half:])
        run_early = _mean([r for b in buckets[:half] for r in b.running])
        run_late = _mean([r for b in buckets[half:] for r in b.running])
        if (early is not None and late is not None and run_early and run_late
                and late > 2 * early + 1e-3 and run_late <= 1.1 * run_early):
            found.append("preemptions up at the same load")
        running = [_mean(b.running) for b in buckets]
        pinned = median([b.used_max for b in buckets[-p.ref_buckets:]]) >= p.pinned_frac * total
        if pinned and None not in running and theil_sen(xs, running, p.z)[2] < 0:
            found.append("pool pinned full while running falls")
        return tuple(found)

    def _floor_ok(self, trend: _Trend) -> bool:
        """Watch-level floor evidence: significant, big, fast (or a lump), not load, batch
        turned over."""
        p, total = self.params, self._total or 1.0
        free = max(total - trend.floor_now, 0.0)
        turned = trend.turnover is None or trend.turnover >= p.turnover_min
        rising = (trend.lower > 0 and trend.slope > 0
                  and trend.rise >= p.watch_rise_frac * total
                  and free / trend.slope <= p.max_hours_to_full
                  and trend.slope >= (1 - p.max_load_share) * max(trend.raw_slope, 0.0))
        return turned and (rising or trend.step >= p.watch_rise_frac * total)

    # -- verdict -------------------------------------------------------------------------
    def _floor_level(self, t: float) -> tuple[LeakState, str]:
        trend, p, total = self._trend, self.params, self._total or 1.0
        if trend is None or self._floor_since is None or self._floor_last is None:
            return "ok", ""
        if t - self._floor_last > p.floor_grace_s + p.bucket_s:
            return "ok", ""
        age = t - self._floor_since
        rate = f"floor rising {trend.slope:.0f} blocks/h under load, not explained by load"
        if trend.step > 0 and trend.step >= trend.rise:  # a clean step's rise is the step
            rate = f"floor stepped up {trend.step:.0f} blocks under load, not explained by load"
        trusted = trend.turnover is not None and trend.load_measure != "none"
        rise = max(trend.rise, trend.step)
        if trusted and rise >= p.leak_rise_frac * total and age >= p.leak_persist_s:
            return "leak", f"{rate}, for {age / 60:.0f} min"
        if trusted and trend.consequences and age >= p.support_persist_s:
            return "leak", f"{rate}, with {trend.consequences[0]}"
        return "watch", f"{rate} (confirming, {age / 60:.0f} min)"

    def _explained_level(self, t: float) -> tuple[LeakState, str]:
        found, p, total = self._unexplained, self.params, self._total or 1.0
        since, last = self._explain_since, self._explain_last
        if found is None or since is None or last is None:
            return "ok", ""
        if t - last > p.floor_grace_s + p.bucket_s:
            return "ok", ""
        age = t - since
        what = (f"{self._amount(found.rise)} {'blocks' if self._in_blocks else 'of the pool'} "
                f"({found.rise / total:.1%} of the pool) held beyond what the load explains "
                f"({found.in_flight_now:.0f} tokens in flight: {self._amount(found.explained_now)}"
                ")")
        if found.rise < p.leak_rise_frac * total:
            return "watch", f"{what}; LEAK from {p.leak_rise_frac:.1%} of the pool"
        if age >= p.leak_persist_s:
            return "leak", f"{what}, for {age / 60:.0f} min"
        return "watch", f"{what} (confirming, {age / 60:.0f} min)"

    def _amount(self, blocks: float) -> str:
        """Blocks, or the share of the pool when only kv_usage is known (a fraction of 1)."""
        return f"{blocks:.0f}" if self._in_blocks else f"{blocks:.1%}"

    def _held_blocks(self, blocks: float) -> str:
        return f"{self._amount(blocks)} {'blocks' if self._in_blocks else 'of the pool'} held"

    def _idle_now(self, t: float) -> tuple[float, float, bool] | None:
        """The idle run this scrape is in: (its least residual, its span, confirmed)."""
        if self._idle_start is None or self._last_t != t:
            return None
        confirmed = bool(self._residuals) and self._residuals[-1][0] >= self._idle_start
        return self._idle_min, t - self._idle_start, confirmed

    def _idle_level(self, t: float) -> tuple[LeakState, str]:
        """The idle evidence, worded for this scrape: what is held now, or at the last idle."""
        if not self._residuals:
            return "ok", ""
        level: LeakState = "leak" if self._residual_long else "watch"
        last_t, blocks = self._residuals[-1]
        now = self._idle_now(t)
        if now is not None and now[2]:
            held = self._held_blocks(blocks) + self._floor_note
            if level == "watch":
                return level, f"{held} at idle (confirming)"
            if self._idle_waiting > 0:
                return level, (f"{held} with nothing running; {self._idle_waiting:.0f} "
                               "waiting requests can't get blocks")
            return level, f"{held} with nothing running or waiting"
        if now is not None and level == "leak":  # the verdict stands on the idles before
            return level, (f"{self._held_blocks(now[0])} with nothing running now; "
                           f"{self._amount(blocks)} at the last confirmed idle"
                           f"{self._floor_note}")
        if now is not None:  # idle again, not confirmed yet: say what the pool holds now
            return level, (f"{self._held_blocks(now[0])} with nothing running (confirming; "
                           f"{self._amount(blocks)} at the last idle){self._floor_note}")
        return level, f"{self._held_blocks(blocks)} at the last idle, {_ago(t - last_t)} ago"

    def _decide(self, t: float, used: float) -> LeakVerdict:
        # Where the server exports its tokens in flight, the level they leave unexplained
        # is the witness under load; the floor's trend is for servers that do not.
        under_load = self._explained_level(t) if self._load else self._floor_level(t)
        level, reason = max(self._idle_level(t), under_load, key=lambda pair: _RANK[pair[0]])
        if level == "leak":
            self._leak_last = t
        if level != "ok":
            self._watch_last = t
            self._evidence_seen = (t, reason)
        held = self._held(t)
        if held is not None and _RANK[held] > _RANK[level]:
            # hysteresis: the state does not flap per scrape, but the reason stays true
            if level == "ok" and self._evidence_seen is not None:
                seen_t, seen = self._evidence_seen
                reason = f"{seen}; not seen for {_ago(t - seen_t)}"
            level = held
        elif level == "ok":
            level, reason = self._quiet(t)
        return self._verdict_for(level, reason, used)

    def _held(self, t: float) -> LeakState | None:
        """A recent LEAK or WATCH outlives its evidence for a while."""
        p = self.params
        if self._leak_last is not None and t - self._leak_last <= p.leak_hold_s:
            return "leak"
        if self._watch_last is not None and t - self._watch_last <= p.watch_hold_s:
            return "watch"
        return None

    def _quiet(self, t: float) -> tuple[LeakState, str]:
        now = self._idle_now(t)
        if now is not None:  # blocks held at idle, not confirmed yet: no leak figure, but say so
            judged = self._trend is not None or self._clean_t is not None
            return "ok" if judged else "warmup", (
                f"{self._held_blocks(now[0])} with nothing running: confirming they are not "
                f"in flight ({now[1]:.0f} s){self._floor_note}")
        if self._pinned_since is not None:
            return "ok", ("KV pool pinned full under load: its level cannot show a leak "
                          f"(for {_ago(t - self._pinned_since)})")
        found = self._unexplained
        if self._load and found is not None:
            return "ok", (f"no blocks held beyond what the load explains over the window "
                          f"({found.in_flight_now:.0f} tokens in flight: "
                          f"{self._amount(found.explained_now)})")
        if self._load and self._trend is not None:
            usable = sum(b.usable for b in self._load)
            return "ok", (f"weighing blocks against tokens in flight: {usable} of "
                          f"{self.params.explain_min_buckets} buckets without preemption "
                          "so far")
        if self._trend is not None:
            return "ok", "no rising floor under load over the window"
        if self._clean_t == t:
            return "ok", "pool drained to its idle floor: nothing leaked so far" + self._floor_note
        if self._clean_t is not None:
            return "ok", (f"nothing leaked when the pool last drained to its idle floor, "
                          f"{_ago(t - self._clean_t)} ago")
        return "warmup", self._reset_why if self._reset_t is not None else "collecting data"

    def _verdict_for(self, level: LeakState, reason: str, used: float) -> LeakVerdict:
        residual = self._residuals[-1][1] if self._residuals else None
        evidence = self._evidence(used, residual)
        if level not in ("watch", "leak"):
            # OK and WARMUP carry no leak figures: a number next to "ok" reads as a leak.
            self._leaked_peak = self._anchor = self._fit = None
            return LeakVerdict(level, reason, None, None, None, evidence)
        trend, total = self._trend, self._total or 0.0
        # Under load, the leak separated from the tokens in flight; the floor's estimate is
        # for servers without them.
        under_load = self._floor_leaked() if not self._load else self._explained_leaked()
        estimates = [v for v in (residual, under_load) if v is not None]
        leaked = max(estimates) if estimates else None
        # The fitted estimate keeps its pre-leak baseline (the anchor), so it neither drifts
        # with the window nor needs propping up; holding its peak would only keep its noise.
        # The fallback (a rise in a sliding window) shrinks as the window slides past the
        # rise, and leaked blocks are never freed: it keeps its peak while the evidence stands.
        if leaked is not None and self._fit is None:
            self._leaked_peak = leaked = max(leaked, self._leaked_peak or 0.0)
        slope = self._residual_slope() or (trend.slope if trend is not None else None)
        if slope is not None and slope <= 0:
            # Leaked blocks are never freed: a window sliding past a lump falls, and a
            # negative rate next to WATCH/LEAK reads as a contradiction. No rate then.
            slope = None
        to_full = (total - used) / slope if slope else None
        if not self._in_blocks:  # kv_usage without blocks_total: no block counts to give
            leaked = slope = None
        return LeakVerdict(level, reason, leaked, slope, to_full, evidence)

    def _explained_leaked(self) -> float | None:
        found = self._unexplained
        return None if found is None else max(found.leaked, 0.0)

    def _floor_leaked(self) -> float | None:
        """The load-separated fit once floor evidence began; else the window's rise. A lump
        the window shows is at least its step: a fit still has few buckets after it."""
        trend = self._trend
        if self._fit is not None and self._last_t is not None:
            fitted = leaked_now(self._fit, self._last_t, self.params.estimate_buckets)
            lump = trend is not None and trend.step > max(trend.rise, 0.0)
            return max(fitted, trend.step) if lump else fitted
        if trend is None:
            return None
        if self._onset is None or self._last_t is None:
            return max(trend.rise, 0.0)
        onset_t, onset_rise = self._onset
        return max(trend.rise, onset_rise + trend.slope * (self._last_t - onset_t) / 3600)

    def _residual_slope(self) -> float | None:
        points = list(self._residuals)
        if len(points) < 2 or points[-1][0] - points[0][0] < 300:
            return None
        xs = [(pt - points[0][0]) / 3600 for pt, _ in points]
        return theil_sen(xs, [r for _, r in points], self.params.z)[0]

    def _evidence(self, used: float, residual: float | None) -> dict[str, float | str]:
        evidence: dict[str, float | str] = {"used": used, "pool": self._total or 0.0,
                                            "units": "blocks" if self._in_blocks else "fraction"}
        if residual is not None:
            evidence["idle_residual"] = residual
        trend = self._trend
        if trend is not None:
            evidence.update(
                floor_slope_per_h=trend.slope, floor_slope_lower_per_h=trend.lower,
                raw_floor_slope_per_h=trend.raw_slope, load_slope_per_h=trend.load_slope,
                blocks_per_load=trend.per_load, floor_rise=trend.rise, floor_step=trend.step,
                floor_now=trend.floor_now, load_measure=trend.load_measure,
                consequences=", ".join(trend.consequences) or "none",
            )
            if trend.turnover is not None:
                evidence["turnover"] = trend.turnover
        if self._floor_since is not None and self._last_t is not None:
            evidence["floor_evidence_s"] = self._last_t - self._floor_since
        found = self._unexplained
        if found is not None:
            evidence.update(
                unexplained_rise=found.rise, unexplained_now=found.now,
                unexplained_base=found.base, unexplained_step=found.step,
                unexplained_drift=found.drift, unexplained_drift_z=found.drift_z,
                unexplained_leaked=found.leaked,
                unexplained_noise=found.noise, unexplained_z=found.z,
                tokens_in_flight=found.in_flight_now, explained_blocks=found.explained_now,
                blocks_per_token=found.per_token, ledger_lost_tokens=found.lost_tokens,
                load_buckets=found.buckets, unexplained_still_up="yes" if found.still_up
                else "no")
        if self._explain_since is not None and self._last_t is not None:
            evidence["unexplained_evidence_s"] = self._last_t - self._explain_since
        return evidence


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _pool(stats: EngineStats) -> tuple[float, float, bool] | None:
    """(used, total, in_blocks); usage alone is taken as a fraction of a pool of 1."""
    usage = stats.kv_usage if stats.kv_usage is None or math.isfinite(stats.kv_usage) else None
    total = stats.blocks_total
    if stats.blocks_used is not None and math.isfinite(stats.blocks_used) and total:
        return stats.blocks_used, float(total), True
    if usage is not None and total:
        return usage * total, float(total), True
    if usage is not None:
        return usage, 1.0, False
    return None


def _load_point(buckets: list[_Bucket], p: LeakParams) -> LoadPoint:
    """The last bucket's level and load: running, and running × tokens per request."""
    last = buckets[-1]
    running = _mean(last.running)
    loads: tuple[float, ...] = ()
    if running is not None:
        per_request = _tokens_per_request(buckets[-p.ref_buckets:])
        loads = (running,) if per_request is None else (running, running * per_request)
    middle = (last.index + 0.5) * p.bucket_s  # the level is the whole bucket's mean
    return LoadPoint(middle, last.used_sum / last.scrapes, loads)


def _load_bucket(buckets: list[_Bucket], p: LeakParams, total: float) -> LoadBucket | None:
    """The last bucket for the load-explained level; None without tokens in flight at
    every scrape, or when requests were aborted while others waited and the tokens they
    may have taken from the ledger are not known."""
    last = buckets[-1]
    running = _mean(last.running)
    if len(last.in_flight) < last.scrapes or running is None:
        return None
    lost = 0.0
    if last.aborted and any(last.waiting):  # aborted before their first token, at worst
        per_request = _tokens_per_request(buckets[-p.ref_buckets:])
        if per_request is None:
            return None
        lost = last.aborted * per_request
    in_flight = sum(last.in_flight) / len(last.in_flight)
    hit_rate = last.prefix_hits / last.prefix_queries if last.prefix_queries else 0.0
    level = last.used_sum / last.scrapes
    # Preempted requests wait with their tokens still counted and no blocks, until resumed.
    calm = [b.preemptions == 0 for b in buckets[-2:]]
    usable = all(calm) and level < p.pinned_frac * total
    return LoadBucket((last.index + 0.5) * p.bucket_s, level, in_flight, running,
                      in_flight * hit_rate, last.prompt / max(last.seconds, 1e-9),
                      last.deferred / last.scrapes, lost, usable)


def _tokens_per_request(recent: list[_Bucket]) -> float | None:
    """Tokens per finished request over these buckets; None without both counters or
    without a finished request."""
    tokens = [b.tokens for b in recent]
    finished = [b.finished for b in recent]
    if None in tokens or None in finished or not sum(finished):  # type: ignore[arg-type]
        return None
    return sum(tokens) / sum(finished)  # type: ignore[arg-type]


def _loads(buckets: list[_Bucket], span: int) -> tuple[list[float], str]:
    """Per-bucket load at the floor: running × tokens per request when known, else running."""
    running = [_mean(b.running) for b in buckets]
    if None in running:
        return [0.0] * len(buckets), "none"
    per_request = []
    for i in range(len(buckets)):
        tokens_per_request = _tokens_per_request(buckets[max(0, i - span + 1):i + 1])
        if tokens_per_request is None:
            return [float(r) for r in running], "running"  # type: ignore[arg-type]
        per_request.append(tokens_per_request)
    return [r * q for r, q in zip(running, per_request, strict=True)], "tokens"  # type: ignore[operator]


def _per_load(levels: list[float], loads: list[float], z: float) -> float:
    """Blocks per unit of load, from bucket-to-bucket changes: a leak adds blocks at a pace
    unrelated to the load's ups and downs, so it barely biases this slope."""
    # a load steady but for float rounding (rates like 2/300 a second) has changes of ~1e-12
    # of itself: read as changes, the slope over them comes out at ~1e10 blocks per unit
    noise = 1e-9 * max((abs(load) for load in loads), default=0.0)
    d_load = [0.0 if abs(b - a) <= noise else b - a for a, b in pairwise(loads)]
    d_level = [b - a for a, b in pairwise(levels)]
    if not any(d_load):
        return 0.0
    return max(theil_sen(d_load, d_level, z)[0], 0.0)


def _turnover(buckets: list[_Bucket]) -> float | None:
    finished = [b.finished for b in buckets if b.finished is not None]
    if not finished:
        return None
    most = max((max(b.running) for b in buckets if b.running), default=0.0)
    return sum(finished) / max(most, 1.0)


def _preempt_rate(buckets: list[_Bucket]) -> float | None:
    counts = [b.preemptions for b in buckets]
    seconds = sum(b.seconds for b in buckets)
    if None in counts or not seconds:
        return None
    return sum(counts) / seconds  # type: ignore[arg-type]
