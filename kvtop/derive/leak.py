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

from kvtop.derive.leak_buckets import Bucket, load_bucket, load_point, pool
from kvtop.derive.leak_estimate import LeakFit, LoadPoint, fit_leak, leaked_now
from kvtop.derive.leak_floor import FloorTrend, enough, floor_ok, floor_trend
from kvtop.derive.leak_load import LoadBucket, Unexplained, explain
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.samples import theil_sen
from kvtop.derive.stats import EngineStats
from kvtop.derive.verdicts import LEAK_RANK as _RANK
from kvtop.derive.verdicts import LeakState, LeakVerdict


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
        self._buckets: deque[Bucket] = deque(maxlen=maxlen)
        self._onset: tuple[float, float] | None = None  # (t, rise) when floor evidence began
        self._trend: FloorTrend | None = None
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
        reading = pool(stats)
        if stats.restarted:
            self._reset(stats.t, "server restarted: evidence reset")
        if reading is None:
            return self._verdict
        used, total, in_blocks = reading
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
        silence = stats.t - self._last_t if self._last_t is not None else 0.0
        self._add_to_bucket(stats, used)
        if silence > self.params.max_gap_s:  # it confirmed nothing: the evidence starts again
            self._forget_evidence_under_load(stats.t, silence)
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
        bucket = Bucket(index, stats.t, used, used, first=not self._buckets)
        bucket.add(stats.t, used, stats)
        self._buckets.append(bucket)

    def _close_bucket(self, t: float) -> None:
        """A bucket ended: redo the trend, the floor evidence's age and the leak fit."""
        closed = [b for b in self._buckets if not b.first]
        if closed:
            self._history.append(load_point(closed, self.params))
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

    def _forget_evidence_under_load(self, t: float, silence: float) -> None:
        """After a silence the window's trend and the load's witness, even as the bucket before
        it closed, are as old as its last scrape: neither is current, nor does either age
        through it. What was held is still told as last seen; idle evidence keeps its own
        rule (max_gap_s breaks an idle run)."""
        self._trend = self._pinned_since = None
        self._floor_since = self._floor_last = self._onset = None
        self._anchor = self._fit = None
        self._unexplained = None
        self._explain_since = self._explain_last = None
        self._reset_t = t
        self._reset_why = f"no scrape for {_ago(silence)}: evidence under load starts again"

    def _update_floor(self, t: float, trend: FloorTrend) -> None:
        if floor_ok(trend, self.params, self._total or 1.0):
            if self._floor_since is None:
                self._floor_since, self._onset = t, (t, trend.rise)
            if self._anchor is None:
                self._anchor = tuple(self._history)
            self._floor_last = t
        elif self._floor_last is None or t - self._floor_last > self.params.floor_grace_s:
            self._floor_since = self._onset = None

    def _explain(self, t: float, closed: list[Bucket]) -> None:
        """Add the bucket just closed to the load-explained level and judge it. A bucket
        without tokens in flight at every scrape starts the level over; one the ledger
        cannot speak for (a preemption, a full pool) keeps standing evidence, starts none;
        one it can speak for without the evidence ends it at once."""
        p = self.params
        point = load_bucket(closed, p, self._total or 1.0)
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
        elif point is not None and point.usable:
            # No grace: LEAK needs the evidence at every close that can speak for
            # leak_persist_s. With the floor's grace (floor_grace_s), evidence at every
            # other close counted as sustained: a load ramp whose best split alternated
            # between two places reached LEAK (last-ramp-up-08, docs/leak-evaluation.md).
            self._explain_since = None
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

    def _analyse(self, all_buckets: list[Bucket]) -> FloorTrend | None:
        """The floor's trend; while too few buckets are left below a pinned pool, none, and
        the window is marked pinned since its last bucket."""
        if not enough(all_buckets, self.params):
            self._pinned_since = None
            return None
        trend = floor_trend(all_buckets, self.params, self._total or 1.0)
        if trend is None:
            self._pinned_since = self._pinned_since or all_buckets[-1].t
            return None
        self._pinned_since = None
        return trend

    # -- verdict -------------------------------------------------------------------------
    def _floor_level(self, t: float) -> tuple[LeakState, str]:
        trend, p, total = self._trend, self.params, self._total or 1.0
        if trend is None or self._floor_since is None:
            return "ok", ""
        age = t - self._floor_since
        rate = f"floor rising {self._blocks(trend.slope)}/h under load, not explained by load"
        if trend.step > 0 and trend.step >= trend.rise:  # a clean step's rise is the step
            rate = f"floor stepped up {self._blocks(trend.step)} under load, not explained by load"
        trusted = trend.turnover is not None and trend.load_measure != "none"
        rise = max(trend.rise, trend.step)
        if trusted and rise >= p.leak_rise_frac * total and age >= p.leak_persist_s:
            return "leak", f"{rate}, for {age / 60:.0f} min"
        if trusted and trend.consequences and age >= p.support_persist_s:
            return "leak", f"{rate}, with {trend.consequences[0]}"
        return "watch", f"{rate} (confirming, {age / 60:.0f} min)"

    def _explained_level(self, t: float) -> tuple[LeakState, str]:
        found, p, total = self._unexplained, self.params, self._total or 1.0
        since = self._explain_since
        if found is None or since is None:
            return "ok", ""
        age = t - since
        what = (f"{self._blocks(found.rise)} "
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

    def _blocks(self, blocks: float) -> str:
        """"1 block", "40 blocks", or "4.0% of the pool" when only kv_usage is known."""
        amount = self._amount(blocks)
        if not self._in_blocks:
            return f"{amount} of the pool"
        return f"{amount} block" if amount == "1" else f"{amount} blocks"

    def _held_blocks(self, blocks: float) -> str:
        return f"{self._blocks(blocks)} held"

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
            if trend is not None and trend.step > max(trend.rise, 0.0):  # a lump
                return max(fitted, trend.step)
            return fitted
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


