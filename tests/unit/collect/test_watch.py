"""The one watch loop (check, record, baseline, rehearse): a real poller on a server on
127.0.0.1 watched until its duration passes, until the consumer's condition holds after a
scrape, or until the caller's stop; a source that ends ends the watch and leaves no timer;
the source is closed after, and an awaitable consumer is awaited before the condition."""

from __future__ import annotations

import asyncio
import time

from kvtop.collect.live import DirectSource
from kvtop.collect.source import OnScrape
from kvtop.collect.target import Scrape, Target
from kvtop.collect.watch import watch
from tests.fakes.faultserver import FaultServer

TARGET = Target.from_spec("127.0.0.1:9")
SLACK_S = 10.0  # what a loaded 2-core machine may add


class Finite:
    """A source with a few scrapes that ends by itself, and says whether it was closed."""

    interval_s = 1.0

    def __init__(self, count: int) -> None:
        self.scrapes = [Scrape(TARGET, float(t), failure="down", error="x")
                        for t in range(count)]
        self.closed = 0

    async def run(self, on_scrape: OnScrape, *, stop: asyncio.Event) -> None:
        for scrape in self.scrapes:
            outcome = on_scrape(scrape)
            if outcome is not None:
                await outcome
            if stop.is_set():
                return

    async def aclose(self) -> None:
        self.closed += 1


async def test_a_watch_ends_when_its_duration_passes() -> None:
    seen: list[Scrape] = []
    async with FaultServer() as server:
        source = DirectSource([Target.from_spec(server.url())], interval_s=0.05)
        started = time.monotonic()
        await watch(source.live(), seen.append, duration_s=0.5)
        took = time.monotonic() - started
    assert 0.5 <= took < 0.5 + SLACK_S
    assert len(seen) >= 2 and all(scrape.ok for scrape in seen)
    assert source.live()._session is None  # closed with the watch


async def test_the_condition_ends_the_watch_at_the_scrape_that_meets_it() -> None:
    seen: list[Scrape] = []
    async with FaultServer() as server:
        source = DirectSource([Target.from_spec(server.url())], interval_s=0.2)
        await watch(source.live(), seen.append, duration_s=60, until=lambda: len(seen) == 3)
    assert len(seen) == 3


async def test_a_stop_of_the_callers_ends_the_watch() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, stop.set)
    seen: list[Scrape] = []
    async with FaultServer() as server:
        source = DirectSource([Target.from_spec(server.url())], interval_s=0.05)
        started = time.monotonic()
        await watch(source.live(), seen.append, stop=stop)
    assert time.monotonic() - started < 0.3 + SLACK_S and seen


async def test_a_source_that_ends_ends_the_watch_and_leaves_no_timer() -> None:
    source, stop, seen = Finite(4), asyncio.Event(), []
    await watch(source, seen.append, duration_s=0.2, stop=stop)
    assert [s.t for s in seen] == [0.0, 1.0, 2.0, 3.0] and source.closed == 1
    await asyncio.sleep(0.4)
    assert not stop.is_set()  # the duration's timer went with the watch


async def test_an_awaitable_consumer_is_awaited_before_the_condition_is_asked() -> None:
    source, done = Finite(5), []

    async def slow(scrape: Scrape) -> None:
        await asyncio.sleep(0.01)
        done.append(scrape)

    await watch(source, slow, stop=asyncio.Event(), until=lambda: len(done) == 2)
    assert len(done) == 2 and source.closed == 1


class Batches:
    """A KV event source that delivers a batch whenever asked, until stopped."""

    def __init__(self) -> None:
        self.delivered = 0
        self.stopped_with_scrapes = False

    async def run(self, on_batch, *, stop: asyncio.Event) -> None:  # type: ignore[no-untyped-def]
        from kvtop.collect.kv_endpoint import TargetKvEvents
        from kvtop.collect.kv_events import KvEventBatch

        while not stop.is_set():
            on_batch(TargetKvEvents(TARGET, KvEventBatch(t=0.0, rank=0, seq=self.delivered)))
            self.delivered += 1
            await asyncio.sleep(0.01)
        self.stopped_with_scrapes = True


async def test_kv_events_come_beside_the_scrapes_and_end_with_them() -> None:
    """A source that ends ends the KV events too (the watch would otherwise never return)."""
    batches, seen = Batches(), []
    source = Finite(3)

    async def slow(scrape: Scrape) -> None:
        await asyncio.sleep(0.05)

    await asyncio.wait_for(watch(source, slow, kv_events=batches,
                                 on_kv_events=lambda item: seen.append(item.batch.seq)), 10)
    assert batches.stopped_with_scrapes and seen == list(range(batches.delivered))
    assert len(seen) >= 3 and source.closed == 1
