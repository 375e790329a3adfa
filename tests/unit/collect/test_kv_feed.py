"""The KV events of several targets as one live source, against real ZeroMQ publishers on
127.0.0.1 (tests/fakes/kv_publisher.py): each batch handed on with its target, a channel
per target whose state the ranks make, an endpoint that cannot be opened told in its own
channel while the others go on, and a consumer's bug that stops nothing."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from kvtop.collect.kv_endpoint import TargetKvEvents, parse_endpoint
from kvtop.collect.kv_feed import KvEventsFeed
from kvtop.collect.target import Target
from tests.fakes.kv_publisher import KvPublisher, stored

A, B = Target.from_spec("10.0.0.1:8000"), Target.from_spec("10.0.0.2:8000")


async def until(ok: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not ok():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.fixture
def publishers() -> list[KvPublisher]:
    pubs = [KvPublisher(), KvPublisher()]
    yield pubs  # type: ignore[misc]
    for pub in pubs:
        pub.close()


async def test_each_batch_comes_with_its_target_and_every_channel_connects(
        publishers: list[KvPublisher]) -> None:
    feed = KvEventsFeed([A, B, Target.from_spec("10.0.0.3:8000")], {
        target.url: parse_endpoint(pub.url, replay=pub.replay_url)
        for target, pub in zip((A, B), publishers, strict=True)})
    assert [t.url for t in feed.targets] == [A.url, B.url]  # the third names no endpoint
    got: list[TargetKvEvents] = []
    stop = asyncio.Event()
    task = asyncio.create_task(feed.run(got.append, stop=stop))
    await until(lambda: all(c.state == "connected" for c in feed.channels.values()))
    for i, pub in enumerate(publishers):
        pub.publish([stored([i + 1])])
    await until(lambda: len(got) == 2)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert {(item.target, item.batch.events[0].hashes) for item in got} == {
        (A, (1,)), (B, (2,))}
    assert feed.channels[A.url].ranks[0].batches == 1


async def test_an_endpoint_that_cannot_be_opened_fails_alone(
        publishers: list[KvPublisher], caplog: pytest.LogCaptureFixture) -> None:
    """Listening on an address another socket holds: that channel says why, the other
    target's events still come."""
    taken = socket.create_server(("127.0.0.1", 0))
    busy = parse_endpoint(f"tcp://127.0.0.1:{taken.getsockname()[1]}", bind=True)
    pub = publishers[0]
    feed = KvEventsFeed([A, B], {A.url: busy, B.url: parse_endpoint(pub.url)})
    got: list[TargetKvEvents] = []
    stop = asyncio.Event()
    task = asyncio.create_task(feed.run(got.append, stop=stop))
    try:
        await until(lambda: feed.channels[A.url].state == "failed"
                    and feed.channels[B.url].state == "connected")
        pub.publish([stored([9])])
        await until(lambda: len(got) == 1)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        taken.close()
    assert "Address already in use" in (feed.channels[A.url].error or "")
    assert got[0].target == B
    [record] = [r for r in caplog.records if r.name == "kvtop.collect.kv_feed"]
    assert record.levelname == "WARNING" and isinstance(record.args, tuple)
    _, error = record.args
    assert record.getMessage() == f"KV events of 10.0.0.1:8000 stopped: {error!r}"
    assert "Address already in use" in str(error)


async def test_a_consumers_bug_stops_no_subscriber(publishers: list[KvPublisher],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    pub = publishers[0]
    feed = KvEventsFeed([A], {A.url: parse_endpoint(pub.url)})
    calls: list[int] = []

    def buggy(item: TargetKvEvents) -> None:
        calls.append(item.batch.seq)
        raise RuntimeError("a consumer's bug")

    stop = asyncio.Event()
    task = asyncio.create_task(feed.run(buggy, stop=stop))
    await until(lambda: feed.channels[A.url].state == "connected")
    pub.publish([stored([1])])
    pub.publish([stored([2], 1)])
    await until(lambda: len(calls) == 2)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert feed.channels[A.url].error is None
    bugs = [r for r in caplog.records if r.name == "kvtop.collect.kv_feed"]
    assert [r.getMessage() for r in bugs] == ["on_batch failed for 10.0.0.1:8000"] * 2
    assert all(r.exc_info and r.exc_info[0] is RuntimeError for r in bugs)


async def test_a_subscriber_stopped_by_a_bug_without_words_names_its_type(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtop.collect.kv_subscriber import KvEventsSubscriber

    async def buggy_run(self: KvEventsSubscriber, stop: asyncio.Event) -> None:
        raise LookupError()

    monkeypatch.setattr(KvEventsSubscriber, "run", buggy_run)
    feed = KvEventsFeed([A], {A.url: parse_endpoint("tcp://127.0.0.1:1")})
    await asyncio.wait_for(feed.run(lambda item: None, stop=asyncio.Event()), 5)
    assert feed.channels[A.url].error == "LookupError"
