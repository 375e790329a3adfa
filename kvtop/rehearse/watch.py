"""What a rehearsal watches: the target's ``/metrics`` through the app's poller, tracker and
leak detector, and the local GPUs through NVML, for the whole run, every scrape written to
the recording.

Scrape times are moved into the target's time (``RunClock``): a simulator run at
``--speed S`` is judged, and recorded, on its own clock, so the leak detector's windows
mean what they mean on a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from kvtop.collect.live import DirectSource
from kvtop.collect.nvml import GpuReader, NvmlUnavailable
from kvtop.collect.reading import Histogram, ServerReading
from kvtop.collect.target import Scrape, Target
from kvtop.collect.watch import watch
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import EngineKey, TargetTracker
from kvtop.derive.worst import EngineVerdict
from kvtop.load.driver import RunClock
from kvtop.store.recording import RecordingWriter

log = logging.getLogger(__name__)

Phase = Literal["before", "load", "after"]


@dataclass(frozen=True, slots=True)
class EnginePoint:
    """One engine at one good scrape (target seconds since the start)."""

    t: float
    phase: Phase
    used: float | None
    total: int | None
    usage: float | None
    running: float | None
    waiting: float | None
    preemptions: float | None
    prefix_queries: float | None
    prefix_hits: float | None
    idle_floor: int

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0


@dataclass(frozen=True, slots=True)
class GpuPoint:
    t: float
    index: int
    name: str
    used: int
    total: int


@dataclass
class WatchData:
    """Everything the judge reads about the server and the GPUs."""

    points: dict[EngineKey, list[EnginePoint]] = field(default_factory=dict)
    verdicts: dict[EngineKey, EngineVerdict] = field(default_factory=dict)
    restarts: list[float] = field(default_factory=list)  # target seconds since the start
    # watch-only latency: cumulative TTFT buckets, summed over engines, at each good scrape
    ttft: list[tuple[float, list[tuple[float, float]]]] = field(default_factory=list)
    gpus: list[GpuPoint] = field(default_factory=list)
    gpu_unavailable: str | None = None
    scrapes: int = 0
    failed_scrapes: int = 0
    last_error: str | None = None
    last_failure: str | None = None  # its kind: down, timeout, auth, bad_payload
    kind: str | None = None
    version: str | None = None
    version_inferred: bool = False  # guessed from the metric names, not read from /version
    cache_config: dict[str, str] = field(default_factory=dict)
    prefix_caching: bool | None = None


class Watcher:
    """Polls one target until stopped; the orchestrator moves ``phase`` along."""

    def __init__(self, target: Target, clock: RunClock, *, interval_s: float,
                 timeout_s: float | None, insecure: bool, full_metrics: bool,
                 leak_params: LeakParams | None, writer: RecordingWriter | None,
                 gpu_reader: GpuReader | None, gpu_interval_s: float,
                 histograms: bool = False,
                 on_gpu: Callable[[GpuPoint], None] | None = None) -> None:
        self.target = target
        self.clock = clock
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.insecure = insecure
        self.full_metrics = full_metrics
        self.writer = writer
        self.gpu_reader = gpu_reader
        self.gpu_interval_s = gpu_interval_s
        self.histograms = histograms
        self.on_gpu = on_gpu
        self.tracker = TargetTracker(target, leak_params=leak_params)
        self.data = WatchData()
        self.phase: Phase = "before"
        self.changed = asyncio.Event()  # set after every scrape

    @property
    def engines(self) -> list[EngineStats]:
        return self.tracker.state.engines

    async def run(self, stop: asyncio.Event) -> None:
        gpus = asyncio.create_task(self._gpus(stop))
        source = DirectSource([self.target], interval_s=self.clock.wall(self.interval_s),
                              timeout_s=self.timeout_s, insecure=self.insecure,
                              narrow=not self.full_metrics)
        try:
            await watch(source.live(), self._on_scrape, stop=stop)
        finally:
            gpus.cancel()
            await asyncio.gather(gpus, return_exceptions=True)

    async def wait_for(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Wait (target time) until ``done()`` holds after a scrape; whether it did."""
        deadline = self.clock.now() + timeout_s
        while not done():
            left = self.clock.wall(deadline - self.clock.now())
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return True

    def idle_scrapes(self, phase: Phase) -> int:
        """Consecutive latest scrapes of ``phase`` with nothing running or waiting anywhere."""
        counts = []
        for points in self.data.points.values():
            count = 0
            for point in reversed(points):
                if point.phase != phase or not point.idle:
                    break
                count += 1
            counts.append(count)
        return min(counts, default=0)

    # -- scrapes ---------------------------------------------------------------------

    def _on_scrape(self, scrape: Scrape) -> None:
        scrape = dataclasses.replace(scrape, t=self.clock.unix0
                                     + self.clock.since_start(scrape.t))
        if self.writer is not None:
            self.writer.write(scrape)
            self.writer.flush()  # a crash or kill loses at most the scrape in flight
        state = self.tracker.update(scrape)
        data = self.data
        if not scrape.ok or state.last_good_t != scrape.t:
            data.failed_scrapes += 1
            data.last_error, data.last_failure = scrape.error, scrape.failure
        else:
            data.scrapes += 1
            data.kind, data.version = state.kind, state.version
            data.version_inferred = state.version_inferred
            self._fold(scrape, state.engines)
        self.changed.set()

    def _fold(self, scrape: Scrape, engines: list[EngineStats]) -> None:
        t = scrape.t - self.clock.unix0  # already in target time
        data = self.data
        for stats in engines:
            key = (stats.model, stats.engine)
            data.points.setdefault(key, []).append(EnginePoint(
                t, self.phase, stats.blocks_used, stats.blocks_total, stats.kv_usage,
                stats.running, stats.waiting, stats.preemptions_total,
                stats.prefix_queries_total, stats.prefix_hits_total, stats.idle_floor_blocks))
            verdict = data.verdicts.setdefault(key, EngineVerdict(stats.model, stats.engine))
            verdict.seen(t, stats.block_size, stats.cache_config)
            if stats.leak is not None:
                verdict.observe(t, stats.leak)
            if stats.stall is not None:
                verdict.observe_stall(t, stats.stall)
            if stats.restarted and (not data.restarts or data.restarts[-1] != t):
                data.restarts.append(t)
            if stats.cache_config:
                data.cache_config = dict(stats.cache_config)
            if stats.prefix_caching is not None:
                data.prefix_caching = stats.prefix_caching
        if self.histograms and scrape.reading is not None:
            self._fold_ttft(t, scrape.reading)

    def _fold_ttft(self, t: float, reading: ServerReading) -> None:
        """Watch-only: the server's TTFT histogram, summed over its engines."""
        histograms = [e.ttft for e in reading.engines if e.ttft is not None]
        if histograms:
            self.data.ttft.append((t, _summed(histograms)))

    # -- GPUs --------------------------------------------------------------------------

    async def _gpus(self, stop: asyncio.Event) -> None:
        reader = self.gpu_reader
        if reader is None:
            self.data.gpu_unavailable = "GPUs not read (--no-gpu)"
            return
        while not stop.is_set():
            try:
                readings = await asyncio.to_thread(reader.read)
            except NvmlUnavailable as exc:
                self.data.gpu_unavailable = exc.reason
                return
            except Exception as exc:  # a driver hiccup must not end the rehearsal
                log.debug("reading GPUs failed", exc_info=True)
                self.data.gpu_unavailable = f"reading GPUs failed: {exc}"
                return
            t = self.clock.now()
            for gpu in readings:
                if gpu.memory_used_bytes is None or gpu.memory_total_bytes is None:
                    continue
                point = GpuPoint(t, gpu.index, gpu.name, gpu.memory_used_bytes,
                                 gpu.memory_total_bytes)
                self.data.gpus.append(point)
                if self.on_gpu is not None:
                    self.on_gpu(point)
            await self.clock.sleep_until(t + self.gpu_interval_s, stop)


def _summed(histograms: list[Histogram]) -> list[tuple[float, float]]:
    """Cumulative buckets added up bound by bound (engines of one server share bounds)."""
    totals: dict[float, float] = {}
    for histogram in histograms:
        for bound, count in histogram.buckets:
            totals[bound] = totals.get(bound, 0.0) + count
    return sorted(totals.items())
