"""The KV-events subscriber against a real ZeroMQ publisher on 127.0.0.1 speaking vLLM's
protocol (tests/fakes/kv_publisher.py): batches delivered whole and in order, a late join
caught up from replay, gaps filled from replay or delivered as lost, a restart told, and
ranks on consecutive ports. The hostile side (floods, garbage, huge messages) is
tests/hostile/test_kv_events.py."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable

import pytest
import zmq
import zmq.asyncio

from kvtop.collect import kv_subscriber
from kvtop.collect.kv_endpoint import KvEventsEndpoint, parse_endpoint
from kvtop.collect.kv_events import BlockRemoved, BlockStored, KvEventBatch
from kvtop.collect.kv_subscriber import KvEventsSubscriber
from tests.fakes.faultserver import closed_port
from tests.fakes.kv_publisher import KvPublisher, payload, removed, stored


class Run:
    def __init__(self, subscriber: KvEventsSubscriber, batches: list[KvEventBatch],
                 task: asyncio.Task[None] | None = None) -> None:
        self.subscriber, self.batches, self.task = subscriber, batches, task

    async def until(self, ok: Callable[[], bool], timeout_s: float = 10.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not ok():
            if self.task is not None and self.task.done():
                self.task.result()  # the subscriber raised: say so now, not at the deadline
                raise AssertionError("the subscriber stopped")
            assert asyncio.get_running_loop().time() < deadline, "timed out"
            await asyncio.sleep(0.01)

    async def connected(self) -> None:
        await self.until(lambda: all(s.state == "connected"
                                     for s in self.subscriber.status()))

    @property
    def seqs(self) -> list[int]:
        return [b.seq for b in self.batches]


@contextlib.asynccontextmanager
async def subscribed(endpoint: KvEventsEndpoint,
                     then: Callable[[KvEventBatch], None] | None = None) -> AsyncIterator[Run]:
    """A subscriber running while the block lasts; each batch is kept, then given to
    ``then``."""
    batches: list[KvEventBatch] = []

    def deliver(batch: KvEventBatch) -> None:
        batches.append(batch)
        if then is not None:
            then(batch)

    subscriber = KvEventsSubscriber(endpoint, deliver)
    stop = asyncio.Event()
    task = asyncio.create_task(subscriber.run(stop))
    run = Run(subscriber, batches, task)
    try:
        await run.until(lambda: bool(subscriber.status()))
        yield run
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


@pytest.fixture
def publisher() -> KvPublisher:
    pub = KvPublisher()
    yield pub  # type: ignore[misc]
    pub.close()


def endpoint_of(pub: KvPublisher, **kwargs: object) -> KvEventsEndpoint:
    return parse_endpoint(pub.url, replay=pub.replay_url, **kwargs)  # type: ignore[arg-type]


async def publish_until_seen(run: Run, pub: KvPublisher, events: list,
                             ts: float | None = None) -> int:
    """A slow-joining SUB misses what was sent before it subscribed: publish until one
    arrives (every one before is caught up from replay)."""
    for _ in range(50):  # 10 s, then a failure rather than a hang
        seq = pub.publish(events, ts=ts)
        with contextlib.suppress(AssertionError):
            await run.until(lambda seq=seq: seq in run.seqs, 0.2)  # type: ignore[misc]
            return seq
    raise AssertionError("no batch arrived")


async def test_batches_arrive_decoded_and_in_order(publisher: KvPublisher) -> None:
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        first = await publish_until_seen(run, publisher, [stored([1, 2], None)])
        publisher.publish([stored([3], 2)])
        publisher.publish([removed([1])])
        await run.until(lambda: len(run.batches) == first + 3)
    assert run.seqs == list(range(first + 3))  # what the join missed came from replay
    last = run.batches[-2:]
    assert last[0].events == (BlockStored((3,), 2, 16, 16, "GPU", None),)
    assert last[1].events == (BlockRemoved((1,), "GPU"),)
    assert all(b.lost == 0 and not b.restart and not b.malformed for b in run.batches)


async def test_a_late_join_learns_what_the_replay_buffer_still_has(
        publisher: KvPublisher) -> None:
    for i in range(3):
        publisher.publish([stored([i], None)])  # nobody listens yet
    publisher.forget(1)  # and the buffer no longer has the first
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        seq = await publish_until_seen(run, publisher, [stored([9], None)])
    assert publisher.replay_requests[0] == 0  # the join asked for everything from 0
    assert run.seqs == list(range(1, seq + 1))  # from the oldest the buffer had
    assert all(b.lost == 0 for b in run.batches)  # before kvtop listened: not lost
    status = run.subscriber.status()[0]
    assert (status.first_seq, status.lost, status.recovered) == (1, 0, 0)


async def test_a_gap_is_filled_from_replay(publisher: KvPublisher) -> None:
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        first = await publish_until_seen(run, publisher, [stored([1], None)])
        for i in range(5):  # dropped on the way, as a high-water mark drops them
            publisher.publish([stored([10 + i], None)], send=False)
        last = publisher.publish([removed([1])])
        await run.until(lambda: last in run.seqs)
    assert run.seqs == list(range(last + 1))
    status = run.subscriber.status()[0]
    assert (status.gaps, status.recovered, status.lost) == (1, 5, 0)
    assert publisher.replay_requests[-1] == first + 1


async def test_what_replay_no_longer_has_is_delivered_as_lost(publisher: KvPublisher) -> None:
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        first = await publish_until_seen(run, publisher, [stored([1], None)])
        for i in range(6):
            publisher.publish([stored([10 + i], None)], send=False)
        publisher.forget(first + 3)  # the replay buffer lost the first two of those six
        last = publisher.publish([removed([1])])
        await run.until(lambda: last in run.seqs)
    status = run.subscriber.status()[0]
    assert (status.gaps, status.recovered, status.lost) == (1, 4, 2)
    after_gap = run.batches[run.seqs.index(first + 3)]
    assert after_gap.lost == 2  # carried by the first batch delivered after the hole


async def test_without_a_replay_socket_the_whole_gap_is_lost() -> None:
    pub = KvPublisher(replay=False)
    try:
        async with subscribed(parse_endpoint(pub.url)) as run:
            await run.connected()
            first = await publish_until_seen(run, pub, [stored([1], None)])
            pub.publish([stored([2], None)], send=False)
            pub.publish([stored([3], None)], send=False)
            last = pub.publish([stored([4], None)])
            await run.until(lambda: last in run.seqs)
    finally:
        pub.close()
    assert run.batches[-1].lost == 2 and run.subscriber.status()[0].lost == 2
    assert run.batches[0].seq == first  # the join had nothing to replay: not lost


async def test_a_publisher_restart_is_told_on_its_first_batch(publisher: KvPublisher) -> None:
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        await publish_until_seen(run, publisher, [stored([1], None)])
        publisher.publish([stored([2], 1)])
        await run.until(lambda: len(run.batches) >= 2)
        asked, before = len(publisher.replay_requests), len(run.batches)
        publisher.restart()
        publisher.publish([stored([7], None)])  # seq 0 again
        await run.until(lambda: run.batches[-1].seq == 0)
        publisher.publish([stored([8], 7)])
        await run.until(lambda: run.batches[-1].seq == 1)
        publisher.restart()  # and again: counted on top of the first
        publisher.publish([stored([7], None)])
        await run.until(lambda: run.batches[-1].seq == 0)
    assert [(b.seq, b.restart, b.lost) for b in run.batches[before:]] == [
        (0, True, 0), (1, False, 0), (0, True, 0)]
    assert run.subscriber.status()[0].restarts == 2
    assert len(publisher.replay_requests) == asked  # nothing before seq 0 to ask replay for


async def test_an_idle_subscriber_waits_in_its_poll(
        publisher: KvPublisher, monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing to read the loop sleeps in ZeroMQ's poll, 100 ms at a time, so it wakes
    at most once per 100 ms: a socket polled for an event always ready (the monitor's
    POLLOUT) made it spin a core while nothing arrived."""
    polls: list[float] = []
    poll = zmq.asyncio.Poller.poll

    def counted(self: zmq.asyncio.Poller, timeout: int | None = None) -> object:
        polls.append(time.monotonic())
        return poll(self, timeout)

    monkeypatch.setattr(zmq.asyncio.Poller, "poll", counted)
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        await publish_until_seen(run, publisher, [stored([1], None)])
        start, before = time.monotonic(), len(polls)
        await asyncio.sleep(0.5)  # idle: nothing is sent
        idle_s, woke = time.monotonic() - start, len(polls) - before
    assert 1 <= woke <= idle_s / 0.1 + 1


async def test_a_flood_is_read_a_burst_at_a_time(publisher: KvPublisher) -> None:
    """A socket that always has more is read BURST messages at a time, then the loop yields
    to the rest of the process (the app, the scrapes) before the next burst."""
    ticks = 0
    at_tick: list[int] = []  # the tick each batch of the flood was delivered at

    async def ticking() -> None:  # a task beside the subscriber: counts its turns
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    def slow(batch: KvEventBatch) -> None:
        at_tick.append(ticks)
        time.sleep(0.001)  # behind the publisher: the socket always has more to read

    ticker = asyncio.create_task(ticking())
    try:
        async with subscribed(endpoint_of(publisher), slow) as run:
            await run.connected()
            await publish_until_seen(run, publisher, [stored([1], None)])
            flood_from = len(at_tick)
            for i in range(4 * kv_subscriber.BURST):
                last = publisher.publish([stored([100 + i], None)])
            await run.until(lambda: last in run.seqs, timeout_s=30)
    finally:
        ticker.cancel()
    runs = [len(list(group)) for _, group in itertools.groupby(at_tick[flood_from:])]
    assert max(runs) == kv_subscriber.BURST  # never more between two turns of the ticker
    assert run.seqs[flood_from:] == list(range(run.seqs[flood_from], last + 1))
    assert run.subscriber.status()[0].gaps == 0


def rank_publishers() -> tuple[KvPublisher, KvPublisher]:
    """Ranks 0 and 1: publishers on ports P and P + 1, their replay sockets on P + 2 and
    P + 3 (asking the system for two ports often gave P + 1 to rank 0's replay socket, and
    the test was skipped)."""
    for _ in range(20):
        port = closed_port()
        try:
            base = KvPublisher(port=port, replay_port=port + 2)
        except zmq.ZMQError:
            continue
        try:
            return base, KvPublisher(port=port + 1, replay_port=port + 3)
        except zmq.ZMQError:
            base.close()
    pytest.skip("no four consecutive ports free on this machine now")


async def test_ranks_listen_on_consecutive_ports() -> None:
    base, second = rank_publishers()
    try:
        async with subscribed(endpoint_of(base, ranks=2)) as run:
            await run.connected()
            await publish_until_seen(run, base, [stored([1], None)])
            seq = await publish_until_seen(run, second, [stored([2], None)])
            await run.until(lambda: any(b.rank == 1 and b.seq == seq for b in run.batches))
    finally:
        second.close()
        base.close()
    assert {b.rank for b in run.batches} == {0, 1}
    assert all(b.events[0].hashes == ((1,) if b.rank == 0 else (2,)) for b in run.batches)


async def connect_and_publish(run: Run, ctx: zmq.Context, port: int, first: int) -> None:
    """A publisher that connects to kvtop's port, as vLLM does, and sends batches ``first``,
    ``first + 1``, ... until one arrives (a slow joiner misses the first); then it goes."""
    pub = ctx.socket(zmq.PUB)
    pub.connect(f"tcp://127.0.0.1:{port}")
    heard = len(run.batches)
    try:
        for seq in range(first, first + 50):
            pub.send_multipart([b"", seq.to_bytes(8, "big"), payload([stored([seq])])])
            await asyncio.sleep(0.01)
            if len(run.batches) > heard:
                break
        await run.until(lambda: len(run.batches) > heard)
    finally:
        pub.close(0)


async def test_kvtop_can_listen_for_a_publisher_that_connects() -> None:
    """vLLM connects when its endpoint names a host (tcp://kvtop-host:5557)."""

    port = closed_port()  # free now: kvtop listens on it (twin/ is not in a mutation copy)
    endpoint = parse_endpoint(f"tcp://127.0.0.1:{port}", bind=True)
    ctx = zmq.Context()
    try:
        async with subscribed(endpoint) as run:
            await connect_and_publish(run, ctx, port, 0)
    finally:
        ctx.term()
    assert run.batches[0].events[0].hashes == (run.batches[0].seq,)


async def test_listening_kvtop_hears_a_publisher_that_comes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A listening socket takes the publisher's next connection itself: kvtop only waits.
    Dialing the rank's address by hand RECONNECT_S after the drop, as it does for a
    publisher it connects to, connected kvtop's SUB to itself and a restarted vLLM was
    never heard again."""
    monkeypatch.setattr(kv_subscriber, "RECONNECT_S", 0.2)
    port = closed_port()
    endpoint = parse_endpoint(f"tcp://127.0.0.1:{port}", bind=True)
    ctx = zmq.Context()
    try:
        async with subscribed(endpoint) as run:
            await connect_and_publish(run, ctx, port, 0)
            await run.until(lambda: run.subscriber.status()[0].state == "disconnected")
            await asyncio.sleep(3 * kv_subscriber.RECONNECT_S)  # away past the reconnect
            await connect_and_publish(run, ctx, port, 100)
    finally:
        ctx.term()
    assert run.batches[-1].seq >= 100  # the second publisher's
    assert run.batches[-1].events[0].hashes == (run.batches[-1].seq,)


async def test_an_address_it_cannot_listen_on_is_an_error_not_a_hang() -> None:
    """The rank's socket that failed to bind was left open and held the context's term()
    forever (the app's KV worker, and a check, never ended)."""
    import socket

    taken = socket.create_server(("127.0.0.1", 0))
    try:
        endpoint = parse_endpoint(f"tcp://127.0.0.1:{taken.getsockname()[1]}", bind=True)
        subscriber = KvEventsSubscriber(endpoint, lambda batch: None)
        with pytest.raises(zmq.ZMQError, match="Address already in use"):
            await asyncio.wait_for(subscriber.run(asyncio.Event()), 5)
    finally:
        taken.close()


async def test_a_batch_sent_again_is_delivered_once(publisher: KvPublisher) -> None:
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        first = await publish_until_seen(run, publisher, [stored([1], None)])
        publisher.send_frames([b"", first.to_bytes(8, "big"), payload([stored([2], None)])])
        last = publisher.publish([removed([1])])
        await run.until(lambda: last in run.seqs)
    assert run.seqs == list(range(last + 1))
    status = run.subscriber.status()[0]
    assert (status.batches, status.gaps, status.restarts, status.lost) == (last + 1, 0, 0, 0)


@pytest.mark.parametrize("missed", [1, 2])  # one replayed batch is the oldest one too
async def test_what_a_restarted_publisher_sent_before_kvtop_saw_it_comes_from_replay(
        publisher: KvPublisher, missed: int) -> None:
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        await publish_until_seen(run, publisher, [stored([1], None)])
        for i in range(5):
            publisher.publish([stored([2 + i], 1 + i)])
        await run.until(lambda: run.seqs[-1:] == [publisher.seq - 1])
        before = len(run.batches)  # the last seen is 5 or more
        publisher.restart()
        for i in range(missed):  # seq 0 (and 1), missed
            publisher.publish([stored([7 + i], 6 + i if i else None)], send=False)
        publisher.publish([stored([7 + missed], 6 + missed)])  # goes back from the last seen
        await run.until(lambda: run.batches[-1].seq == missed)
    after = run.batches[before:]
    assert [(b.seq, b.restart, b.lost) for b in after] == [
        (0, True, 0), *((seq, False, 0) for seq in range(1, missed + 1))]
    assert [b.events[0].hashes for b in after] == [(7 + i,) for i in range(missed + 1)]
    status = run.subscriber.status()[0]
    assert (status.restarts, status.gaps, status.recovered, status.lost) == (1, 0, 0, 0)


async def test_each_batch_is_stamped_by_the_subscribers_clock(publisher: KvPublisher) -> None:
    batches: list[KvEventBatch] = []
    ticks = iter(range(1_000, 2_000))
    subscriber = KvEventsSubscriber(endpoint_of(publisher), batches.append,
                                    clock=lambda: float(next(ticks)))
    stop = asyncio.Event()
    task = asyncio.create_task(subscriber.run(stop))
    run = Run(subscriber, batches, task)
    try:
        await run.until(lambda: bool(subscriber.status()))
        await run.connected()
        seq = await publish_until_seen(run, publisher, [stored([1], None)], ts=55.5)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert [b.t for b in batches] == [1_000.0 + i for i in range(seq + 1)]
    assert batches[-1].ts == 55.5
    assert subscriber.status()[0].last_t == batches[-1].t


@pytest.mark.parametrize("frames", [
    [b"", b"\x00" * 7, b"\x90"], [b"", b"\x00" * 9, b"\x90"],  # a seq of 7 or 9 bytes
    [b"", b"\x00" * 8], [b"", b"\x00" * 8, b"\x90", b""],  # 2 or 4 frames
])
async def test_a_message_that_is_not_topic_seq_payload_is_counted_and_skipped(
        publisher: KvPublisher, frames: list[bytes]) -> None:
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        first = await publish_until_seen(run, publisher, [stored([1], None)])
        publisher.send_frames(frames)
        last = publisher.publish([removed([1])])
        await run.until(lambda: last in run.seqs)
    assert run.seqs == list(range(last + 1)) and last == first + 1
    status = run.subscriber.status()[0]
    assert (status.bad_frames, status.gaps, status.malformed) == (1, 0, 0)


def padded(size: int) -> bytes:
    """A batch of one event kvtop does not read, ``size`` bytes long (bin32 padding)."""
    empty = len(payload([{"type": "Padding", "pad": b""}], ts=1.0))
    data = payload([{"type": "Padding", "pad": b"\0" * (size - empty - 3)}], ts=1.0)
    assert len(data) == size
    return data


async def test_a_payload_up_to_64_bytes_over_the_mebibyte_arrives_and_one_more_costs_the_batch(
        publisher: KvPublisher) -> None:
    """ZeroMQ's own limit is 1 MiB + 64: up to it the decoder refuses the batch (malformed,
    said); past it ZeroMQ drops the connection, kvtop makes it again, the batch is lost."""
    mib = 1 << 20
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        await publish_until_seen(run, publisher, [stored([1], None)])
        whole = publisher.publish([], raw=padded(mib))
        over = publisher.publish([], raw=padded(mib + 64))
        await run.until(lambda: over in run.seqs)
        dropped = publisher.publish([], raw=padded(mib + 65))
        publisher.forget(dropped + 1)  # replay cannot send it either
        await run.until(lambda: run.subscriber.status()[0].state == "disconnected")
        dropped_at = time.monotonic()
        await run.connected()  # made again by hand, a second on: ZeroMQ does not
        waited = time.monotonic() - dropped_at
        last = await publish_until_seen(run, publisher, [stored([2], None)])
    delivered = {b.seq: b for b in run.batches}
    assert (delivered[whole].unknown, delivered[whole].problem) == (1, None)
    assert delivered[over].problem == "a batch of 1,048,640 bytes (over 1,048,576)"
    assert dropped not in delivered and delivered[dropped + 1].lost == 1
    status = run.subscriber.status()[0]
    assert (status.malformed, status.lost, status.gaps) == (1, 1, 1)
    assert last in delivered
    assert waited >= 0.5  # ZeroMQ's own reconnect had its second (at once: under 0.2 s)


async def test_a_replay_that_does_not_answer_costs_its_gap_and_the_next_replay_is_read(
        publisher: KvPublisher) -> None:
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        await publish_until_seen(run, publisher, [stored([1], None)])
        publisher.replay_silent = 2
        for _ in range(2):
            missed = publisher.publish([stored([2], None)], send=False)
            after_silence = publisher.publish([stored([3], None)])
            await run.until(lambda seq=after_silence: seq in run.seqs)  # after the 2 s wait
        recovered = publisher.publish([stored([4], None)], send=False)
        last = publisher.publish([stored([5], None)])
        await run.until(lambda: last in run.seqs)
        publisher.publish([stored([6], None)], send=False)
        last = publisher.publish([stored([7], None)])
        await run.until(lambda: last in run.seqs)
    assert missed not in run.seqs and recovered in run.seqs and last - 1 in run.seqs
    assert run.batches[run.seqs.index(after_silence)].lost == 1
    status = run.subscriber.status()[0]
    assert (status.gaps, status.replay_failures, status.lost, status.recovered) == (4, 2, 2, 2)
    # the socket that waited in vain is replaced (a late answer must not be read as the next
    # replay's); a socket that answered is kept, not one more made per gap
    silent, *answered = publisher.replay_clients[-3:]
    assert silent not in answered and answered[0] == answered[1]


async def test_a_replay_cut_at_its_limit_leaves_no_tail_for_the_next_one(
        publisher: KvPublisher, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer longer than MAX_REPLAY batches is cut there and counted a failure; its
    socket goes with it, so the next replay does not read the old tail (and its end marker)
    as its own answer and lose its gap."""
    monkeypatch.setattr(kv_subscriber, "MAX_REPLAY", 3)
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        await publish_until_seen(run, publisher, [stored([1], None)])
        for i in range(5):  # more than one replay may return
            publisher.publish([stored([10 + i], None)], send=False)
        after_cut = publisher.publish([stored([2], None)])
        await run.until(lambda: after_cut in run.seqs)
        dropped = publisher.publish([stored([3], None)], send=False)
        last = publisher.publish([stored([4], None)])
        await run.until(lambda: last in run.seqs)
    assert dropped in run.seqs  # the second replay read its own answer
    status = run.subscriber.status()[0]
    assert (status.replay_failures, status.recovered, status.lost) == (1, 5, 1)  # 4 + 1
    cut, fresh = publisher.replay_clients[-2:]
    assert cut != fresh


async def test_a_replay_of_exactly_max_replay_batches_is_whole_and_one_more_is_cut(
        publisher: KvPublisher, monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer to a gap holds every batch from its start, the one that showed the gap
    included: at MAX_REPLAY 3, two missed batches make an answer of 3 and its end marker,
    whole; three make 4, cut after the third missed one (read and delivered, but the answer
    was too long: a failure, and its socket goes)."""
    monkeypatch.setattr(kv_subscriber, "MAX_REPLAY", 3)

    def counts() -> tuple[int, int, int]:
        status = run.subscriber.status()[0]
        return status.replay_failures, status.recovered, status.lost

    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        await publish_until_seen(run, publisher, [stored([1], None)])
        joined = counts()  # the join's answer may have been cut already
        shown = []
        for missed in (2, 3):
            for i in range(missed):
                publisher.publish([stored([10 + i], None)], send=False)
            last = publisher.publish([stored([2], None)])
            await run.until(lambda last=last: last in run.seqs)  # type: ignore[misc]
            shown.append(counts())
    assert run.seqs[-7:] == list(range(last - 6, last + 1))
    failures, recovered, lost = joined
    assert shown == [(failures, recovered + 2, lost), (failures + 1, recovered + 5, lost)]
    at_limit, over = publisher.replay_clients[-2:]
    assert at_limit == over  # the whole answer's socket was kept for the next


async def test_replayed_frames_of_the_wrong_shape_are_counted_and_the_rest_is_read(
        publisher: KvPublisher) -> None:
    seq8 = (5).to_bytes(8, "big")
    publisher.replay_junk = [[b"", b"", seq8], [b"", b"", b"\0" * 7, b"\x90"],
                             [b"", b"", b"\0" * 9, b"\x90"], [b"", b"", seq8, b"\x90", b""]]
    async with subscribed(endpoint_of(publisher)) as run:
        await run.connected()
        first = await publish_until_seen(run, publisher, [stored([1], None)])
        joined = run.subscriber.status()[0].bad_frames  # the join's replay had them too
        publisher.publish([stored([2], None)], send=False)
        last = publisher.publish([stored([3], None)])
        await run.until(lambda: last in run.seqs)
    assert run.seqs[-3:] == [first, first + 1, last]
    status = run.subscriber.status()[0]
    assert (status.bad_frames - joined, status.recovered, status.lost) == (4, 1, 0)
