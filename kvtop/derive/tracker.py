"""Per-target state: folds successive scrapes into what the views show.

The same :class:`TargetTracker` serves the live app, replay and the headless commands, so
every number is computed the same way wherever it is shown. It folds readings: every source
delivers a good scrape with its reading made (:func:`kvtop.collect.source.read_scrape`).

Memory per target is bounded: an answer refused by the adapters (a value no pool can have,
a body over the parser's limits) is a ``bad_payload`` failure; at most ``MAX_ENGINES`` engines
are read per scrape; an engine not seen for ``forget_after_s`` loses its history, detectors
and previous reading, and past ``MAX_TRACKED_ENGINES`` the longest unseen go first (a server
that invents new model names every scrape costs no more than one with 512 engines).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Literal

from kvtop.collect.adapters.common import MAX_ENGINES
from kvtop.collect.gpu import GpuReading
from kvtop.collect.kv_endpoint import KvChannel
from kvtop.collect.kv_events import KvEventBatch
from kvtop.collect.reading import EngineReading, ServerKind, ServerReading
from kvtop.collect.target import Scrape, Target
from kvtop.derive.kv_anatomy import AnatomyParams, KvAnatomy
from kvtop.derive.kv_index import DROP_FRACTION
from kvtop.derive.leak import LeakDetector
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.limits import LimitDetector, LimitParams
from kvtop.derive.rates import derive_engine_stats
from kvtop.derive.stall import StallDetector
from kvtop.derive.stats import EngineStats
from kvtop.derive.verdicts import LeakVerdict

TargetStatus = Literal["pending", "up", "down", "timeout", "auth", "bad_payload", "stale"]
EngineKey = tuple[str | None, str | None]  # (model, engine)

DEFAULT_HISTORY_S = 15 * 60.0
MAX_TRACKED_ENGINES = 2 * MAX_ENGINES  # engines with history and a detector, per target
MAX_KV_EVENT_RANKS = 64  # data-parallel ranks whose KV events one target folds


@dataclass(slots=True)
class TargetState:
    """What kvtop knows about one target now."""

    target: Target
    status: TargetStatus = "pending"
    error: str | None = None  # why the last scrape failed, if it did
    failure: TargetStatus | None = None  # how it failed (also while "stale": last values kept)
    kind: ServerKind | None = None
    version: str | None = None  # from /version, else the adapter's inference ("0.7+")
    version_inferred: bool = False  # version is the inference, never to be read as exact
    engines: list[EngineStats] = field(default_factory=list)  # last good values
    last_attempt_t: float | None = None
    last_good_t: float | None = None
    last_good: Scrape | None = None  # the last good scrape itself
    restarted_at: float | None = None  # last time a counter went backwards
    notes: list[str] = field(default_factory=list)
    # Of the last good scrape: engines past MAX_ENGINES left out ("too many engines"), and
    # impossible values left out (each is named in ``notes``).
    engines_over_cap: int = 0
    impossible_values: int = 0
    gpus: list[GpuReading] = field(default_factory=list)  # a GPU exporter's, last good values
    kv_channel: KvChannel | None = None  # its KV events' channel, while subscribed (live)

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
        forget_after_s: float | None = None,
        limit_params: LimitParams | None = None,
        anatomy_params: AnatomyParams | None = None,
    ) -> None:
        self.state = TargetState(target=target)
        self.stale_after_s = stale_after_s
        self.history_s = history_s
        self.forget_after_s = history_s if forget_after_s is None else forget_after_s
        self.leak_params = leak_params
        self.history: dict[EngineKey, deque[EngineStats]] = {}
        self.detectors: dict[EngineKey, LeakDetector] = {}
        self.stall_detectors: dict[EngineKey, StallDetector] = {}
        self.limit_detectors: dict[EngineKey, LimitDetector] = {}
        self.limit_params = limit_params
        self.anatomy_params = anatomy_params
        self.kv_events: dict[int, KvAnatomy] = {}  # by data-parallel rank, when subscribed
        self._previous: dict[EngineKey, EngineReading] = {}
        self._previous_t: float | None = None
        self._last_seen: dict[EngineKey, float] = {}  # oldest first
        self._server_version: str | None = None  # as /version said (never one inferred)

    @property
    def readings(self) -> dict[EngineKey, EngineReading]:
        """Each engine's reading at the last good scrape (raw counters and histograms)."""
        return self._previous

    def update(self, scrape: Scrape) -> TargetState:
        """Fold one scrape in. A scrape older than the newest one seen is ignored."""
        state = self.state
        if state.last_attempt_t is not None and scrape.t < state.last_attempt_t:
            return state
        state.last_attempt_t = scrape.t
        if scrape.version:
            self._server_version = scrape.version
            state.version, state.version_inferred = scrape.version, False
        if not scrape.ok:
            self._fold_failure(scrape.t, scrape.failure or "down", scrape.error)
            return state
        if scrape.reading is None:
            raise ValueError(f"a scrape of {scrape.target.label} came unread: its source "
                             "must make its reading (kvtop.collect.source.read_scrape)")
        self._fold_good(scrape, scrape.reading)
        return state

    def update_kv_events(self, batch: KvEventBatch) -> None:
        """Fold one batch of the target's KV events (its engine's stats carry them from the
        next scrape). Ranks past MAX_KV_EVENT_RANKS are left out; the ranks' block indexes
        share ``index_cap`` blocks (the target's memory is bounded, not each rank's)."""
        anatomy = self.kv_events.get(batch.rank)
        if anatomy is None:
            if len(self.kv_events) >= MAX_KV_EVENT_RANKS:
                return
            anatomy = self.kv_events[batch.rank] = KvAnatomy(self.anatomy_params)
            self._share_index_cap(anatomy.params.index_cap)
        anatomy.fold(batch)

    def _share_index_cap(self, target_cap: int) -> None:
        """The ranks' block indexes share the target's cap: one more rank, smaller shares
        (each index drops to its share at its next new block)."""
        share = max(DROP_FRACTION, target_cap // len(self.kv_events))
        for anatomy in self.kv_events.values():
            anatomy.index.cap = share

    def _anatomy_of(self, engine: str | None) -> KvAnatomy | None:
        """An engine's KV events: vLLM's engine label is its data-parallel rank (no label:
        one engine, rank 0)."""
        if engine is None:
            return self.kv_events.get(0)
        if engine.isascii() and engine.isdigit() and len(engine) <= 6:
            return self.kv_events.get(int(engine))
        return None

    def _fold_good(self, scrape: Scrape, reading: ServerReading) -> None:
        state = self.state
        state.kind = reading.kind
        if self._server_version is None:  # inferred from each scrape: a restart may change it
            state.version, state.version_inferred = reading.version, reading.version is not None
        state.notes = reading.notes
        state.engines_over_cap = reading.engines_over_cap
        state.impossible_values = reading.impossible_values
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
            stat.leak = _leak_verdict(detector, stat)
            stat.stall = self.stall_detectors.setdefault(key, StallDetector()).update(stat)
            limits = self.limit_detectors.get(key)
            if limits is None:
                limits = self.limit_detectors[key] = LimitDetector(self.limit_params)
            stat.limit = limits.update(stat)
            anatomy = self._anatomy_of(engine.engine)
            if anatomy is not None:
                stat.kv_events = anatomy.stats(scrape.t, stat.blocks_total)
            restarted |= stat.restarted
            stats.append(stat)
            self._remember(key, stat)
        if restarted:
            state.restarted_at = scrape.t
        self._forget_unseen(scrape.t)
        self._previous, self._previous_t = current, scrape.t
        state.engines = stats
        state.status = "up"
        state.error = state.failure = None
        state.last_good_t = scrape.t
        state.last_good = scrape

    def _fold_failure(self, t: float, failure: TargetStatus, error: str | None) -> None:
        state = self.state
        state.error = error
        state.failure = failure
        fresh = state.last_good_t is not None and t - state.last_good_t <= self.stale_after_s
        if fresh:
            state.status = "stale"
            return
        state.status = failure
        state.engines = []
        state.gpus = []

    def _remember(self, key: EngineKey, stat: EngineStats) -> None:
        series = self.history.setdefault(key, deque())
        series.append(stat)
        while series and stat.t - series[0].t > self.history_s:
            series.popleft()
        self._last_seen.pop(key, None)  # re-inserted: the dict stays oldest first
        self._last_seen[key] = stat.t

    def _forget_unseen(self, now: float) -> None:
        """Drop the engines not seen for ``forget_after_s``, and the longest unseen past
        MAX_TRACKED_ENGINES (the dict is oldest first, so this stops at the first kept)."""
        last_seen = self._last_seen
        while last_seen:
            key, seen = next(iter(last_seen.items()))
            if now - seen <= self.forget_after_s and len(last_seen) <= MAX_TRACKED_ENGINES:
                break
            del last_seen[key]
            self.history.pop(key, None)
            self.detectors.pop(key, None)
            self.stall_detectors.pop(key, None)
            self.limit_detectors.pop(key, None)


def _leak_verdict(detector: LeakDetector, stats: EngineStats) -> LeakVerdict:
    """The leak detector's verdict; an engine asleep has let its KV pool go (vLLM's sleep
    mode), which is neither a leak cleared nor a crash: its evidence is kept, not fed."""
    if stats.sleep_state in (None, "awake"):
        return detector.update(stats)
    return replace(detector.verdict, reason=f"engine asleep ({stats.sleep_state}): the leak "
                   f"evidence so far is kept; {detector.verdict.reason}")
