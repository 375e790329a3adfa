"""Watch a source for a while: the one loop behind ``check``, ``record``, ``baseline`` and
``rehearse``. Scrapes go to the consumer as they come (and, given a KV event source, its
batches beside them), until the duration passes, the consumer's stop condition holds, the
stop event is set, or Ctrl-C / SIGTERM."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable

from kvtop.collect.clock import stop_event
from kvtop.collect.kv_endpoint import OnKvEvents
from kvtop.collect.source import KvEventSource, OnScrape, ScrapeSource, opened
from kvtop.collect.target import Scrape


async def watch(source: ScrapeSource, on_scrape: OnScrape, *, duration_s: float | None = None,
                until: Callable[[], bool] | None = None,
                stop: asyncio.Event | None = None,
                kv_events: KvEventSource | None = None,
                on_kv_events: OnKvEvents | None = None) -> None:
    """Feed ``source`` into ``on_scrape`` until ``duration_s`` passes (None: no limit),
    ``until()`` holds after a scrape, or ``stop`` is set. Without a ``stop`` of the
    caller's, Ctrl-C and SIGTERM end the watch (a caller with its own stop says when).
    With ``kv_events``, its batches go to ``on_kv_events`` for as long as the scrapes
    come. The source is closed afterwards when it holds connections."""
    stop = stop_event() if stop is None else stop
    timer = (asyncio.get_running_loop().call_later(duration_s, stop.set)
             if duration_s is not None else None)

    async def consume(scrape: Scrape) -> None:
        outcome = on_scrape(scrape)
        if inspect.isawaitable(outcome):
            await outcome
        if until is not None and until():
            stop.set()

    ended = asyncio.Event()  # the KV events stop with the scrapes, whatever ends them

    async def scrapes() -> None:
        try:
            await source.run(consume, stop=stop)
        finally:
            ended.set()

    try:
        async with opened(source):
            if kv_events is None or on_kv_events is None:
                await scrapes()
            else:
                await asyncio.gather(scrapes(), kv_events.run(on_kv_events, stop=ended))
    finally:
        if timer is not None:
            timer.cancel()
