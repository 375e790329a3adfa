"""A KV event feed the tests drive by hand (what the app's KV events tap runs): a channel
per target, batches pushed by the test and handed on with their target until stopped."""

from __future__ import annotations

import asyncio

from kvtop.collect.kv_endpoint import (
    KvChannel,
    KvEventsEndpoint,
    OnKvEvents,
    RankStatus,
    TargetKvEvents,
)
from kvtop.collect.kv_events import KvEventBatch
from kvtop.collect.target import Target


class FakeKvFeed:
    def __init__(self, targets: list[Target]) -> None:
        self.channels = {t.url: KvChannel(KvEventsEndpoint(f"tcp://127.0.0.1:{5557 + i}"),
                                          [RankStatus(0, "connected")])
                         for i, t in enumerate(targets)}
        self.queue: asyncio.Queue[TargetKvEvents] = asyncio.Queue()
        self.running = False

    async def run(self, on_batch: OnKvEvents, *, stop: asyncio.Event) -> None:
        self.running = True
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                getting = asyncio.ensure_future(self.queue.get())
                done, _ = await asyncio.wait({getting, stopping},
                                             return_when=asyncio.FIRST_COMPLETED)
                if getting not in done:
                    getting.cancel()
                    return
                on_batch(getting.result())
        finally:
            stopping.cancel()

    def push(self, target: Target, batch: KvEventBatch) -> None:
        self.queue.put_nowait(TargetKvEvents(target, batch))
