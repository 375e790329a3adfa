"""Score kvtop and two baseline rules on one recording against its ground truth.

kvtop runs exactly as `kvtop check --replay` does: every scrape through `CheckRun` (one
`TargetTracker` per target, hence the same parser, rates and `LeakDetector`). The baselines
read the same parsed `kv_usage` per scrape:

* threshold: usage > 0.9 at every scrape for 5 min (Prometheus `> 0.9` with `for: 5m`);
* trend: least-squares slope of usage over the last 30 min > 1 % of the pool per hour,
  holding at every scrape for 10 min (Prometheus `deriv(...[30m]) > 0.01/3600`, `for: 10m`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtop.derive.worst import CheckRun
from kvtop.store.recording import read_recording


class SustainedRule:
    """Fires at the first time its condition has held at every scrape for `hold_s`."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._since: float | None = None
        self.fired: list[float] = []  # start times of each alarm episode

    def observe(self, t: float, condition: bool) -> None:
        if not condition:
            self._since = None
            return
        if self._since is None:
            self._since = t
        if t - self._since >= self.hold_s and (not self.fired or self.fired[-1] < self._since):
            self.fired.append(t)


class ThresholdRule(SustainedRule):
    def __init__(self, level: float = 0.9, hold_s: float = 300.0) -> None:
        super().__init__(hold_s)
        self.level = level

    def update(self, t: float, usage: float) -> None:
        self.observe(t, usage > self.level)


class TrendRule(SustainedRule):
    """Ordinary least-squares slope of usage over a trailing window (like `deriv`)."""

    def __init__(self, per_hour: float = 0.01, window_s: float = 1800.0,
                 hold_s: float = 600.0) -> None:
        super().__init__(hold_s)
        self.per_hour, self.window_s = per_hour, window_s
        self._points: deque[tuple[float, float]] = deque()

    def update(self, t: float, usage: float) -> None:
        self._points.append((t, usage))
        while t - self._points[0][0] > self.window_s:
            self._points.popleft()
        self.observe(t, len(self._points) >= 2 and self._slope() * 3600 > self.per_hour)

    def _slope(self) -> float:
        n = len(self._points)
        mt = sum(p[0] for p in self._points) / n
        mu = sum(p[1] for p in self._points) / n
        sxx = sum((p[0] - mt) ** 2 for p in self._points)
        sxy = sum((p[0] - mt) * (p[1] - mu) for p in self._points)
        return sxy / sxx if sxx else 0.0


@dataclass
class Score:
    name: str
    leak_start_t: float | None
    kvtop_verdict: str
    kvtop_leak_t: list[float] = field(default_factory=list)  # each time LEAK began
    kvtop_watch_t: list[float] = field(default_factory=list)  # each time WATCH (or more) began
    threshold_t: list[float] = field(default_factory=list)
    trend_t: list[float] = field(default_factory=list)
    est_at_detection: tuple[float | None, float] | None = None  # (kvtop estimate, truth)
    est_at_end: tuple[float | None, float] | None = None
    idle_share: float = 0.0  # scrapes with nothing running, after the leak start (or all)
    leaked_at_end: float = 0.0
    measured_fill_h: float | None = None  # pool / true leak rate over the run
    max_usage: float = 0.0
    preemptions: float = 0.0
    watch_reached: float | None = None  # delay (s) to the first WATCH-or-LEAK scrape after start
    ok_scrapes: int = 0  # scrapes whose verdict was OK or WARMUP
    ok_figures: dict[str, int] = field(default_factory=dict)  # ...that still gave a figure
    check_json: dict[str, Any] = field(default_factory=dict)  # `kvtop check --json`'s engine

    def first_after(self, times: list[float]) -> float | None:
        """Delay (s) of the first alarm at or after the leak start."""
        if self.leak_start_t is None:
            return None
        after = [t - self.leak_start_t for t in times if t >= self.leak_start_t]
        return after[0] if after else None

    def false_alarms(self, times: list[float]) -> int:
        """Alarms on healthy data: all of them on a healthy run, those before the leak else."""
        return sum(1 for t in times if self.leak_start_t is None or t < self.leak_start_t)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def score(name: str, recording: Path, truth: dict[str, Any]) -> Score:
    rec = read_recording(recording)
    by_t = {row[0]: row for row in truth["scrapes"]}
    result = Score(name, truth["leak_start_t"], "unknown")
    run, threshold, trend = CheckRun(), ThresholdRule(), TrendRule()
    state_before, idle, counted, last_preempt = "ok", 0, 0, 0.0
    for scrape in rec.in_time_order():
        run.feed(scrape)
        engines = run.trackers[scrape.target.url].state.engines
        if not engines or engines[0].leak is None:
            continue
        stats, verdict = engines[0], engines[0].leak
        row = by_t[scrape.t]
        if stats.kv_usage is not None:
            threshold.update(scrape.t, stats.kv_usage)
            trend.update(scrape.t, stats.kv_usage)
            result.max_usage = max(result.max_usage, stats.kv_usage)
        if verdict.state == "leak" and state_before != "leak":
            result.kvtop_leak_t.append(scrape.t)
            if result.est_at_detection is None and _after_start(result, scrape.t):
                result.est_at_detection = (verdict.leaked_blocks, row[1])
        if verdict.state in ("watch", "leak") and state_before not in ("watch", "leak"):
            result.kvtop_watch_t.append(scrape.t)
        state_before = verdict.state
        if (result.watch_reached is None and result.leak_start_t is not None
                and scrape.t >= result.leak_start_t and verdict.state in ("watch", "leak")):
            result.watch_reached = scrape.t - result.leak_start_t
        if verdict.state in ("ok", "warmup"):
            _count_ok_figures(result, verdict)
        result.est_at_end = (verdict.leaked_blocks, row[1])
        if _after_start(result, scrape.t):
            counted, idle = counted + 1, idle + (row[3] == 0)
        if stats.preemptions_total is not None:  # summed across restarts
            result.preemptions += max(stats.preemptions_total - last_preempt, 0.0) if (
                stats.preemptions_total >= last_preempt) else stats.preemptions_total
            last_preempt = stats.preemptions_total
    result.kvtop_verdict = run.verdict()
    result.check_json = run.to_json()["targets"][0]["engines"][0]
    result.threshold_t, result.trend_t = threshold.fired, trend.fired
    result.idle_share = idle / counted if counted else 0.0
    _leak_size(result, truth)
    return result


FIGURES = ("leaked_blocks", "slope_blocks_per_hour", "hours_to_full")


def _count_ok_figures(result: Score, verdict: Any) -> None:
    result.ok_scrapes += 1
    for name in FIGURES:
        if getattr(verdict, name) is not None:
            result.ok_figures[name] = result.ok_figures.get(name, 0) + 1


def _after_start(result: Score, t: float) -> bool:
    return result.leak_start_t is None or t >= result.leak_start_t


def _leak_size(result: Score, truth: dict[str, Any]) -> None:
    last = truth["scrapes"][-1]
    result.leaked_at_end = last[1]
    start = result.leak_start_t
    if start is not None and last[1] > 0:
        hours = (last[0] - start) / 3600
        result.measured_fill_h = truth["pool"] / (last[1] / hours)
