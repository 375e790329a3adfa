"""Per-target state: folds successive scrapes into what the views show.

The same :class:`TargetTracker` serves the live app, replay and the headless commands, so
every number is computed the same way wherever it is shown.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from kvtop.collect.adapters import adapt, read_exposition
from kvtop.collect.gpu import GpuReading
from kvtop.collect.reading import EngineReading, ServerKind
from kvtop.collect.target import FailureKind, Scrape, Target
from kvtop.derive.leak import LeakDetector, LeakParams
from kvtop.derive.rates import derive_engine_stats
from kvtop.derive.stats import EngineStats

TargetStatus = Literal["pending", "up", "down", "timeout", "auth", "bad_payload", "stale"]
EngineKey = tuple[str | None, str | None]  # (model, engine)

DEFAULT_HISTORY_S = 15 * 60.0


@dataclass(slots=True)
class TargetState:
    """What kvtop knows about one target now."""

    target: Target
    status: TargetStatus = "pending"
    error: str | None = None  # why the last scrape failed, if it did
    failure: FailureKind | None = None  # how it failed (also while "stale": last values kept)
    kind: ServerKind | None = None
    version: str | None = None
    engines: list[EngineStats] = field(default_factory=list)  # last good values
    last_attempt_t: float | None = None
    last_good_t: float | None = None
    last_good: Scrape | None = None  # the last good scrape itself
    restarted_at: float | None = None  # last time a counter went backwards
    notes: list[str] = field(default_factory=list)
    gpus: list[GpuReading] = field(default_factory=list)  # a GPU exporter's, last good values

    @property
    def last_body(self) -> str | None:
        """The /metrics text of the last good scrape (made on demand from its samples)."""
        return self.last_good.text() if self.last_good is not None else None

    def age_s(self, now: float) -> float | None:
        """Seconds since the last good scrape."""
        return None if self.last_good_t is None else max(0.0, now - self.last_good_t)


class TargetTracker:
    """Turns the scrapes of one target into a :class:`TargetState` and a bounded history."""

    def __init__(
        self,
        target: Target,
        *,
        stale_after_s: float = 60.0,
        history_s: float = DEFAULT_HISTORY_S,
        leak_params: LeakParams | None = None,
    ) -> None:
        self.state = TargetState(target=target)
        self.stale_after_s = stale_after_s
        self.history_s = history_s
        self.leak_params = leak_params
        self.history: dict[EngineKey, deque[EngineStats]] = {}
        self.detectors: dict[EngineKey, LeakDetector] = {}
        self._previous: dict[EngineKey, EngineReading] = {}
        self._previous_t: float | None = None

    def update(self, scrape: Scrape) -> TargetState:
        """Fold one scrape in. A scrape older than the newest one seen is ignored."""
        state = self.state
        if state.last_attempt_t is not None and scrape.t < state.last_attempt_t:
            return state
        state.last_attempt_t = scrape.t
        if scrape.version:
            state.version = scrape.version
        if scrape.ok:
            self._fold_good(scrape)
        else:
            self._fold_failure(scrape)
        return state

    def _fold_good(self, scrape: Scrape) -> None:
        state = self.state
        if scrape.samples is not None:
            reading = adapt(scrape.samples, version=state.version)
        else:
            assert scrape.body is not None
            reading = read_exposition(scrape.body, version=state.version)
        state.kind = reading.kind
        if reading.version and not state.version:
            state.version = reading.version
        state.notes = reading.notes
        state.gpus = reading.gpus
        dt = None if self._previous_t is None else scrape.t - self._previous_t
        stats: list[EngineStats] = []
        restarted = False
        current: dict[EngineKey, EngineReading] = {}
        for engine in reading.engines:
            key = (engine.model, engine.engine)
            current[key] = engine
            stat = derive_engine_stats(engine, self._previous.get(key), scrape.t, dt)
            detector = self.detectors.get(key)
            if detector is None:
                detector = self.detectors[key] = LeakDetector(self.leak_params)
            stat.leak = detector.update(stat)
            restarted |= stat.restarted
            stats.append(stat)
            self._remember(key, stat)
        if restarted:
            state.restarted_at = scrape.t
        self._previous, self._previous_t = current, scrape.t
        state.engines = stats
        state.status = "up"
        state.error = state.failure = None
        state.last_good_t = scrape.t
        state.last_good = scrape

    def _fold_failure(self, scrape: Scrape) -> None:
        state = self.state
        state.error = scrape.error
        state.failure = scrape.failure or "down"
        fresh = state.last_good_t is not None and scrape.t - state.last_good_t <= self.stale_after_s
        if fresh:
            state.status = "stale"
            return
        state.status = scrape.failure or "down"
        state.engines = []
        state.gpus = []

    def _remember(self, key: EngineKey, stat: EngineStats) -> None:
        series = self.history.setdefault(key, deque())
        series.append(stat)
        while series and stat.t - series[0].t > self.history_s:
            series.popleft()
