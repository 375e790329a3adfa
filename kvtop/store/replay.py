"""Replay a recording as a scrape source: the app and ``kvtop check`` consume its scrapes
exactly as they consume the live poller's, so every number is computed the same way.

:class:`RecordingSource` is a recording as the commands read it: every scrape stored, in
time order, nothing live. :class:`ReplaySource` is the app's replay:
the replay keeps its own clock (recording time). It can pause, step one scrape, seek and
change speed. Seeking backwards calls ``on_rewind`` (the consumer drops its state) and then
re-delivers every scrape from the start up to the new position at once, because rates,
history and the leak evidence depend on everything before. So a replay only ever reads the
recording forward, from its start: it streams the file and holds one scrape, never all.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Protocol

from kvtop.collect.kv_endpoint import OnKvEvents, TargetKvEvents
from kvtop.collect.source import ALL, OnScrape, Source
from kvtop.collect.target import Scrape, Target

MIN_SPEED, MAX_SPEED = 0.1, 1000.0


class Replayable(Protocol):
    """A recording as a replay needs it: a file streamed from disk
    (:class:`~kvtop.store.reader.RecordingFile`) or one held in memory."""

    @property
    def interval_s(self) -> float: ...
    @property
    def start_t(self) -> float: ...
    @property
    def end_t(self) -> float: ...
    def in_time_order(self) -> Iterator[Scrape]: ...
    def items_in_time_order(self) -> Iterator[Scrape | TargetKvEvents]: ...


class Stored(Replayable, Protocol):
    """A recording as a command reads it (:class:`~kvtop.store.reader.RecordingFile`)."""

    path: Path
    warnings: list[str]

    def targets(self) -> list[Target]: ...


class RecordingSource(Source):
    """A recording for a command: its scrapes are all stored, whatever span is asked."""

    name = "the recording"

    def __init__(self, recording: Stored) -> None:
        super().__init__(recording.targets())
        self.recording = recording
        self.interval_s = recording.interval_s

    @property
    def warnings(self) -> list[str]:
        """What was skipped while the file was checked, each line naming the file."""
        return [f"{self.recording.path}: {text}" for text in self.recording.warnings]

    async def stored(self, span_s: float | None, *, kv_events: bool = False,
                     ) -> tuple[Iterator[Scrape | TargetKvEvents], float]:
        recording = self.recording
        return (recording.items_in_time_order() if kv_events
                else recording.in_time_order()), ALL


class ReplaySource:
    """Delivers a recording's scrapes to ``on_scrape`` at recording time; with
    ``on_kv_events``, its KV event batches too, in their place among the scrapes."""

    def __init__(self, recording: Replayable, *, speed: float = 1.0,
                 on_rewind: Callable[[], None] | None = None,
                 on_kv_events: OnKvEvents | None = None) -> None:
        self.recording = recording
        self.on_kv_events = on_kv_events
        self.start_t = recording.start_t
        self.end_t = recording.end_t
        self.interval_s = recording.interval_s
        self._changed = asyncio.Event()
        self.set_speed(speed)
        self.paused = False
        self.on_rewind = on_rewind
        self._scrapes: Iterator[Scrape | TargetKvEvents] = iter(())
        self._next: Scrape | TargetKvEvents | None = None  # the next one to deliver
        self._last_t = -math.inf  # the time of the last one delivered
        self._round_end = -math.inf  # a step delivers every scrape up to here
        self._restart()
        self._now = self.start_t
        self._pending_rewind = False
        self._moves = 0  # seeks and steps so far: a sleeping clock must not overwrite them

    def _restart(self) -> None:
        """Read the recording again from its start (it is streamed, never held)."""
        close = getattr(self._scrapes, "close", None)
        if close is not None:
            close()
        recording = self.recording
        self._scrapes = (recording.items_in_time_order() if self.on_kv_events is not None
                         else recording.in_time_order())
        self._next = next(self._scrapes, None)
        self._last_t = -math.inf

    # -- the clock ------------------------------------------------------------------------

    def now(self) -> float:
        """Recording time: what 'now' is for ages and plots during a replay."""
        return self._now

    @property
    def finished(self) -> bool:
        return self._next is None

    def set_speed(self, speed: float) -> None:
        self.speed = min(MAX_SPEED, max(MIN_SPEED, speed))
        self._changed.set()

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        self._changed.set()

    def step(self) -> None:
        """Deliver the next round of scrapes now (meant for a paused replay): the next one
        and every other within half an interval of it (each target's of that round), the
        clock at the last of them. A fleet's scrapes of one round are milliseconds apart:
        one step is one round, and the clock moves by an interval, not by milliseconds."""
        if self._next is not None:
            self._now = self._next.t
            self._round_end = self._next.t + self.interval_s / 2
            self._moves += 1
            self._changed.set()

    def seek(self, t: float) -> None:
        """Jump to recording time ``t`` (clamped to the recording)."""
        t = min(self.end_t, max(self.start_t, t))
        self._round_end = -math.inf
        if t < self._last_t:  # behind what was delivered: everything again from the start
            self._pending_rewind = True
            self._restart()
        self._now = t
        self._moves += 1
        self._changed.set()

    # -- delivery -------------------------------------------------------------------------

    async def run(self, on_scrape: OnScrape, *, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        while not stop.is_set():
            await self._deliver_due(on_scrape)
            if self._pending_rewind:  # a seek back during delivery
                continue
            if self.finished:
                self.paused = True
            await self._wait_for_time(stop)

    async def _deliver_due(self, on_scrape: OnScrape) -> None:
        if self._pending_rewind:
            self._pending_rewind = False
            if self.on_rewind is not None:
                self.on_rewind()
        while (scrape := self._next) is not None and scrape.t <= max(self._now, self._round_end):
            if isinstance(scrape, TargetKvEvents):
                assert self.on_kv_events is not None
                result = self.on_kv_events(scrape)
            else:
                result = on_scrape(scrape)
            self._last_t = scrape.t
            self._now = max(self._now, scrape.t)  # a step's round moves the clock along
            self._next = next(self._scrapes, None)
            if inspect.isawaitable(result):
                await result
            if self._pending_rewind:  # a seek back came in meanwhile: rewind first
                return
        self._round_end = -math.inf

    async def _wait_for_time(self, stop: asyncio.Event) -> None:
        """Sleep until the next scrape is due (or something changes), advancing the clock."""
        self._changed.clear()
        if self.paused or self._next is None:
            await _first(self._changed.wait(), stop.wait())
            return
        due, start_now, moves = self._next.t, self._now, self._moves
        loop = asyncio.get_running_loop()
        started = loop.time()
        await _first(self._changed.wait(), stop.wait(),
                     asyncio.sleep(max(0.0, (due - start_now) / self.speed)))
        if self._moves == moves:  # no seek or step meanwhile: the clock ran at `speed`
            elapsed = (loop.time() - started) * self.speed
            self._now = due if start_now + elapsed >= due - 1e-6 else start_now + elapsed


async def _first(*awaitables: Awaitable[object]) -> None:
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
