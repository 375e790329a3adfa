"""Replay a recording as a scrape source: the app and ``kvtop check`` consume its scrapes
exactly as they consume the live poller's, so every number is computed the same way.

The replay keeps its own clock (recording time). It can pause, step one scrape, seek and
change speed. Seeking backwards calls ``on_rewind`` (the consumer drops its state) and then
re-delivers every scrape from the start up to the new position at once, because rates,
history and the leak evidence depend on everything before.
"""

from __future__ import annotations

import asyncio
import bisect
import inspect
from collections.abc import Awaitable, Callable

from kvtop.collect.target import Scrape
from kvtop.store.recording import Recording

OnScrape = Callable[[Scrape], "Awaitable[None] | None"]
MIN_SPEED, MAX_SPEED = 0.1, 1000.0


class ReplaySource:
    def __init__(self, recording: Recording, *, speed: float = 1.0,
                 on_rewind: Callable[[], None] | None = None) -> None:
        self.scrapes = sorted(recording.scrapes, key=lambda s: s.t)
        self._times = [s.t for s in self.scrapes]
        self.start_t = self._times[0] if self._times else 0.0
        self.end_t = self._times[-1] if self._times else 0.0
        self.interval_s = recording.interval_s
        self.speed = speed
        self.paused = False
        self.on_rewind = on_rewind
        self._next = 0  # index of the next scrape to deliver
        self._now = self.start_t
        self._changed = asyncio.Event()
        self._pending_rewind = False
        self._moves = 0  # seeks and steps so far: a sleeping clock must not overwrite them

    # -- the clock ------------------------------------------------------------------------

    def now(self) -> float:
        """Recording time: what 'now' is for ages and plots during a replay."""
        return self._now

    @property
    def finished(self) -> bool:
        return self._next >= len(self.scrapes)

    def set_speed(self, speed: float) -> None:
        self.speed = min(MAX_SPEED, max(MIN_SPEED, speed))
        self._changed.set()

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        self._changed.set()

    def step(self) -> None:
        """Deliver the next scrape now (meant for a paused replay)."""
        if not self.finished:
            self._now = self._times[self._next]
            self._moves += 1
            self._changed.set()

    def seek(self, t: float) -> None:
        """Jump to recording time ``t`` (clamped to the recording)."""
        t = min(self.end_t, max(self.start_t, t))
        target_index = bisect.bisect_right(self._times, t)
        if target_index < self._next:
            self._pending_rewind = True
            self._next = 0
        self._now = t
        self._moves += 1
        self._changed.set()

    # -- delivery -------------------------------------------------------------------------

    async def run(self, on_scrape: OnScrape, *, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        while not stop.is_set():
            await self._deliver_due(on_scrape)
            if self.finished and not self._pending_rewind:
                self.paused = True
            await self._wait_for_time(stop)

    async def _deliver_due(self, on_scrape: OnScrape) -> None:
        if self._pending_rewind:
            self._pending_rewind = False
            if self.on_rewind is not None:
                self.on_rewind()
        while not self.finished and self._times[self._next] <= self._now:
            result = on_scrape(self.scrapes[self._next])
            self._next += 1
            if inspect.isawaitable(result):
                await result

    async def _wait_for_time(self, stop: asyncio.Event) -> None:
        """Sleep until the next scrape is due (or something changes), advancing the clock."""
        self._changed.clear()
        if self.paused or self.finished:
            await _first(self._changed.wait(), stop.wait())
            return
        due, start_now, moves = self._times[self._next], self._now, self._moves
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
