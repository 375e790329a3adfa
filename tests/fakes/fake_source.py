"""A ScrapeSource the tests drive by hand: push a scrape, the app receives it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kvtop.collect.source import ScrapeReader
from kvtop.collect.target import Scrape


class FakeSource:
    """Emits the scrapes given up front, then whatever the test pushes, until stopped; as
    every source, it delivers them read."""

    def __init__(self, scrapes: list[Scrape] | None = None, interval_s: float = 1.0) -> None:
        self.initial = list(scrapes or [])
        self.interval_s = interval_s
        self.queue: asyncio.Queue[Scrape] | None = None
        self.delivered: list[Scrape] = []

    async def run(
        self, on_scrape: Callable[[Scrape], Awaitable[None] | None], *, stop: asyncio.Event
    ) -> None:
        self.queue = asyncio.Queue()
        read = ScrapeReader()
        for scrape in self.initial:
            self.queue.put_nowait(scrape)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                getting = asyncio.ensure_future(self.queue.get())
                done, _ = await asyncio.wait(
                    {getting, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                if getting not in done:
                    getting.cancel()
                    break
                scrape = read(getting.result())
                outcome = on_scrape(scrape)
                if outcome is not None:
                    await outcome
                self.delivered.append(scrape)
        finally:
            stopping.cancel()

    def push(self, *scrapes: Scrape) -> None:
        assert self.queue is not None, "the app has not started the source yet"
        for scrape in scrapes:
            self.queue.put_nowait(scrape)
