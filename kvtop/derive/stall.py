"""Per-engine stall verdict: is the server making progress on the requests it holds?

* **STALLED** - requests running or waiting, and no token generated (no prompt token, no
  request finished) for a few scrapes. Said at once, with the reason; the KV pool is named
  when it is full with requests waiting, the wedge a leak ends in.
* **SATURATED** - the pool pinned full with requests waiting and being preempted, while
  tokens still come out: the KV cache is the bottleneck, not a fault.
* **OK** - anything else; **UNKNOWN** when the server does not export what it takes
  (running/waiting counts, a generated-token counter) or rates need another scrape.
  A metric that is missing is never read as 0.

Method and parameters: docs/leak-detector.md ("The stall verdict").
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from kvtop.derive.stats import EngineStats
from kvtop.derive.verdicts import StallState, StallVerdict


@dataclass(frozen=True)
class StallParams:
    min_scrapes: int = 3  # scrape windows without progress before STALLED...
    min_s: float = 5.0  # ...spanning at least this long
    # Only running requests, nothing waiting, pool not full: one huge prompt can prefill
    # this long without a token, so STALLED waits longer there.
    lone_s: float = 60.0
    full_frac: float = 0.95  # usage counted as a full pool (a STALLED reason names it)
    pinned_frac: float = 0.9  # median usage over saturated_s counted as pinned full
    saturated_s: float = 60.0  # window over which the pool is pinned, queued and preempting



def _progress(stats: EngineStats) -> bool | None:
    """Tokens came out (or prompts were done, or requests finished) in the scrape window;
    None without a window or without a generated-token counter."""
    if not stats.window_s or stats.generation_tps is None:
        return None
    finished = sum(stats.finished_per_s.values())
    return stats.generation_tps > 0 or bool(stats.prompt_tps) or finished > 0


class StallDetector:
    """Feed one :class:`EngineStats` per scrape, in time order; read :attr:`verdict`."""

    def __init__(self, params: StallParams | None = None) -> None:
        self.params = params or StallParams()
        self._verdict = StallVerdict("unknown", "no scrape yet", None)
        self._still_since: float | None = None  # last scrape before the windows without progress
        self._still_windows = 0
        # (t, usage, requests waiting, preempted in the window) over the last saturated_s
        self._recent: deque[tuple[float, float, bool, bool]] = deque()

    @property
    def verdict(self) -> StallVerdict:
        return self._verdict

    def update(self, stats: EngineStats) -> StallVerdict:
        """Fold one scrape in and return the verdict after it."""
        self._verdict = self._judge(stats)
        return self._verdict

    def _judge(self, stats: EngineStats) -> StallVerdict:
        t, running, waiting = stats.t, stats.running, stats.waiting
        if running is None and waiting is None:
            return self._set(t, "unknown", "the server exports no running or waiting count")
        if stats.restarted:
            self._still_since = None
            self._recent.clear()
        progress = _progress(stats)
        if progress is None:
            missing = stats.window_s and stats.generation_tps is None
            return self._set(t, "unknown", "the server exports no generated-token counter"
                             if missing else "rates need another scrape")
        busy = (running or 0) + (waiting or 0) > 0
        usage = stats.usage
        evidence: dict[str, float | str] = {"running": running or 0.0, "waiting": waiting or 0.0}
        if usage is not None:
            evidence["kv_usage"] = usage
        self._track(stats, busy, progress, usage)
        stalled = self._stalled(stats, usage)
        if stalled is not None:
            evidence["no_progress_s"] = t - (self._still_since or t)
            return self._set(t, "stalled", stalled, evidence, since=self._still_since)
        saturated = self._saturated(t)
        if saturated is not None:
            return self._set(t, "saturated", saturated, evidence)
        return self._set(t, "ok", "making progress" if busy else "no requests", evidence)

    def _track(self, stats: EngineStats, busy: bool, progress: bool, usage: float | None) -> None:
        t = stats.t
        if busy and not progress:
            if self._still_since is None:
                self._still_since, self._still_windows = t - (stats.window_s or 0.0), 0
            self._still_windows += 1
        else:
            self._still_since, self._still_windows = None, 0
        recent = self._recent
        if usage is None:
            recent.clear()
            return
        recent.append((t, usage, bool(stats.waiting), bool(stats.preemptions_per_s)))
        while t - recent[0][0] > self.params.saturated_s:
            recent.popleft()

    def _stalled(self, stats: EngineStats, usage: float | None) -> str | None:
        """The reason the engine is stalled, or None while it is not (yet)."""
        p, since = self.params, self._still_since
        if since is None or self._still_windows < p.min_scrapes or stats.t - since < p.min_s:
            return None
        span = stats.t - since
        running, waiting = stats.running or 0.0, stats.waiting or 0.0
        full = usage is not None and usage >= p.full_frac
        if not waiting and not full and span < p.lone_s:
            return None  # a lone long prefill gives no token for a while
        counts = f"{running:.0f} running, {waiting:.0f} waiting"
        if full and waiting:
            return (f"KV pool {usage:.0%} full with {waiting:.0f} requests waiting: no token "
                    f"generated for {span:.0f} s ({running:.0f} running)")
        pool = "" if usage is None else f"; KV pool {usage:.0%} used"
        return f"no token generated for {span:.0f} s with {counts}{pool}"

    def _saturated(self, t: float) -> str | None:
        """Over the last saturated_s: the pool full at most scrapes, a queue at half of
        them, and preemptions; None otherwise (or with too short a history)."""
        p, recent = self.params, self._recent
        if not recent or t - recent[0][0] < p.saturated_s * 0.9:
            return None
        usage = statistics.median(u for _, u, _, _ in recent)
        queued = sum(q for _, _, q, _ in recent) / len(recent)
        preempted = any(pre for _, _, _, pre in recent)
        if usage < p.pinned_frac or queued < 0.5 or not preempted:
            return None
        return (f"KV pool pinned full (median {usage:.0%} over {p.saturated_s:.0f} s), requests "
                "waiting and being preempted; still making progress")

    def _set(self, t: float, state: StallState, reason: str,
             evidence: dict[str, float | str] | None = None,
             since: float | None = None) -> StallVerdict:
        previous = self._verdict
        if since is None:
            since = previous.since_t if previous.state == state else t
        return StallVerdict(state, reason, since, evidence or {})
