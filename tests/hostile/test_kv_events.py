"""A hostile or broken KV-event publisher (docs/security.md, "KV events"): each fault is a
documented state in the subscriber's status and the anatomy, memory stays bounded, and
nothing raises.

* a slow consumer: the publisher's high-water mark drops batches; replay fills the gaps it
  still buffers, the rest is delivered as lost;
* a batch over 1 MiB: ZeroMQ drops that connection; the batch is lost, later ones arrive;
* endless hashes, unknown event tags, bytes that are not msgpack, frames of the wrong shape;
* a flood of new hashes: the block index stays at its cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import tracemalloc
from collections.abc import AsyncIterator

import msgspec

from kvtop.collect.kv_endpoint import parse_endpoint
from kvtop.collect.kv_events import MAX_HASHES, MAX_PAYLOAD_BYTES, BlockStored, KvEventBatch
from kvtop.collect.kv_subscriber import KvEventsSubscriber
from kvtop.derive.kv_anatomy import AnatomyParams, KvAnatomy
from tests.fakes.kv_publisher import KvPublisher, payload, removed, stored
from tests.support.waiting import eventually


@contextlib.asynccontextmanager
async def listening(pub: KvPublisher, on_batch: object = None,
                    ) -> AsyncIterator[tuple[KvEventsSubscriber, list[KvEventBatch]]]:
    batches: list[KvEventBatch] = []

    def fold(batch: KvEventBatch) -> None:
        batches.append(batch)
        if callable(on_batch):
            on_batch(batch)

    subscriber = KvEventsSubscriber(parse_endpoint(pub.url, replay=pub.replay_url), fold)
    stop = asyncio.Event()
    task = asyncio.create_task(subscriber.run(stop))
    try:
        await eventually(lambda: subscriber.status() and subscriber.status()[0].state
                         == "connected", "connected")
        while not batches:  # past the slow-joiner window
            pub.publish([stored([0])])
            await asyncio.sleep(0.02)
        yield subscriber, batches
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def settle(pub: KvPublisher, batches: list[KvEventBatch]) -> int:
    """A gap shows only when a later batch arrives (vLLM publishes every busy step): publish
    one at a time until the newest is delivered; its sequence number."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        last = pub.publish([])
        await asyncio.sleep(0.1)
        if batches[-1].seq == last:
            return last
    raise AssertionError("the stream never caught up")


async def test_a_slow_consumer_loses_nothing_replay_still_has() -> None:
    pub = KvPublisher(hwm=10)  # drops past 10 queued batches, as vLLM's PUB past its hwm
    slow = lambda _batch: time.sleep(0.002)  # noqa: E731 - 2 ms a batch: far behind

    try:
        async with listening(pub, slow) as (subscriber, batches):
            for i in range(2_000):
                pub.publish([stored([10_000 + i], None), removed([10_000 + i])])
            last = await settle(pub, batches)
    finally:
        pub.close()
    status = subscriber.status()[0]
    assert status.gaps > 0, "the high-water mark never dropped: the test proves nothing"
    assert [b.seq for b in batches] == list(range(batches[0].seq, last + 1))  # whole, in order
    assert status.lost == 0 and status.recovered > 0


async def test_what_replay_forgot_is_lost_and_counted() -> None:
    pub = KvPublisher(hwm=10, buffer=50)  # replay keeps only the last 50
    try:
        async with listening(pub, lambda _b: time.sleep(0.002)) as (subscriber, batches):
            for i in range(2_000):
                pub.publish([stored([i], None)])
            last = await settle(pub, batches)
    finally:
        pub.close()
    status = subscriber.status()[0]
    delivered = len(batches)
    assert status.lost > 0 and delivered + status.lost == last + 1 - batches[0].seq
    assert sum(b.lost for b in batches) == status.lost


async def test_a_batch_over_a_mebibyte_costs_the_batch_not_the_stream() -> None:
    pub = KvPublisher()
    try:
        async with listening(pub) as (subscriber, batches):
            pub.publish([], raw=b"\x00" * (MAX_PAYLOAD_BYTES + 1024))  # ZeroMQ drops the peer
            big = pub.seq - 1
            await settle(pub, batches)  # it reconnects; replay cannot send the big one either
    finally:
        pub.close()
    status = subscriber.status()[0]
    assert big not in [b.seq for b in batches]  # never decoded, never held
    assert status.lost >= 1 and status.replay_failures >= 1


async def test_garbage_is_counted_and_the_stream_goes_on() -> None:
    pub = KvPublisher()
    anatomy = KvAnatomy()
    try:
        async with listening(pub, anatomy.fold) as (subscriber, batches):
            pub.send_frames([b"", b"1234567"])  # two frames, a seq of 7 bytes
            pub.send_frames([b"x"])
            pub.publish([], raw=b"\xc1 not msgpack")
            pub.publish([{"type": "BlockPinned", "x": 1}, ["Unknown"], stored([5], None)])
            pub.publish([removed(range(MAX_HASHES + 1))])  # endless hashes
            pub.publish([], raw=msgspec.msgpack.encode([1.0, [[[[[[[]]]]]]] * 1000, 0]))
            last = pub.publish([], raw=payload([stored([6], 5)], rank=999))
            await eventually(lambda: batches[-1].seq == last, "the last batch")
    finally:
        pub.close()
    status = subscriber.status()[0]
    assert status.bad_frames == 2
    assert status.malformed == 2  # not msgpack, too many hashes
    assert (status.lost, status.gaps) == (0, 0)
    stats = anatomy.stats(0.0, 100)
    # a tag kvtop does not read, an array of no tag, and the 1,000 nested arrays
    assert stats.unknown_events == 1002 and stats.malformed == 2
    assert stats.population == 1  # 6 alone: the malformed batch after 5 emptied the index
    assert batches[-1].rank == 0  # the rank of the socket, not the one the payload claims


def test_a_flood_of_new_hashes_keeps_the_index_at_its_cap() -> None:
    anatomy = KvAnatomy(AnatomyParams(index_cap=10_000))
    tracemalloc.start()
    try:
        for seq in range(200):
            keys = tuple(range(seq * 1_000, (seq + 1) * 1_000))  # 200,000 new blocks
            anatomy.fold(KvEventBatch(t=float(seq), rank=0, seq=seq, ts=float(seq),
                                      events=(BlockStored(keys, None, 16_000, 16, "GPU"),)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    stats = anatomy.stats(0.0, None)
    assert stats.population <= 10_000 and stats.index_dropped >= 190_000
    assert peak < 16 << 20, f"{peak / 2**20:.1f} MiB for an index of 10,000 blocks"

