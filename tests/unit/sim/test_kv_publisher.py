"""The simulator's KV-event publisher against real ZeroMQ sockets on 127.0.0.1: the frames a
subscriber and a replay client get, byte for byte, as vLLM 0.33 sends them (the wire format
is docs/kv-anatomy.md's; tests/fakes/kv_publisher.py is the same protocol from the other
side). The end-to-end count through kvtop's subscriber is tests/unit/sim/test_server.py's."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio

from kvtop.sim.kv_publisher import END_SEQ, SimKvPublisher, _event

STORED = ("S", (11, 12), 10)
REMOVED = ("R", 11)
TIMEOUT_S = 5.0


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def batch(ts: float, *events: dict) -> list:
    return [ts, list(events), 0]


@pytest.fixture
async def publisher() -> AsyncIterator[SimKvPublisher]:
    started = SimKvPublisher()
    await started.start()
    yield started
    await started.stop()


class Client:
    """A subscriber and a replay client (DEALER) of one publisher, as kvtop's are."""

    def __init__(self, publisher: SimKvPublisher) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(publisher.url)
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.connect(publisher.replay_url)

    async def replay(self, *frames: bytes) -> list[list[bytes]]:
        """Every answer to one request, up to and with the end marker."""
        await self.dealer.send_multipart(list(frames))
        answers = []
        while not answers or answers[-1][2] != END_SEQ:
            answers.append(await asyncio.wait_for(self.dealer.recv_multipart(), TIMEOUT_S))
        return answers

    async def subscribed(self, publisher: SimKvPublisher) -> None:
        """Publish until the subscription is through (PUB drops before it), then empty it."""
        while True:
            publisher.publish(0.0, [], 16)
            try:
                await asyncio.wait_for(self.sub.recv_multipart(), 0.05)
                break
            except asyncio.TimeoutError:
                continue
        while await self.sub.poll(100):
            await self.sub.recv_multipart()

    def close(self) -> None:
        self.sub.close(linger=0)
        self.dealer.close(linger=0)
        self.ctx.term()


@pytest.fixture
async def client(publisher: SimKvPublisher) -> AsyncIterator[Client]:
    connected = Client(publisher)
    yield connected
    connected.close()


def decode(payload: bytes) -> list:
    return msgspec.msgpack.decode(payload)


def test_pool_events_are_vllm_block_events() -> None:
    assert _event(STORED, 4) == {
        "type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": 10,
        "token_ids": [0] * 8, "block_size": 4, "lora_id": None, "medium": "GPU",
        "lora_name": None, "group_idx": 0}
    assert _event(("S", (7,), None), 16)["token_ids"] == [0] * 16
    assert _event(REMOVED, 4) == {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU",
                                  "group_idx": 0}


async def test_each_batch_goes_out_with_the_next_sequence_number(
        publisher: SimKvPublisher, client: Client) -> None:
    await client.subscribed(publisher)
    first = publisher.seq
    publisher.publish(12.5, [STORED, REMOVED], 4)
    publisher.publish(13.0, [], 4)
    assert publisher.seq == first + 2
    topic, seq, payload = await asyncio.wait_for(client.sub.recv_multipart(), TIMEOUT_S)
    assert (topic, seq) == (b"", seq_bytes(first))
    assert decode(payload) == batch(12.5, _event(STORED, 4), _event(REMOVED, 4))
    assert await asyncio.wait_for(client.sub.recv_multipart(), TIMEOUT_S) == [
        b"", seq_bytes(first + 1), msgspec.msgpack.encode(batch(13.0))]


async def test_a_replay_sends_every_batch_from_the_one_asked_then_the_end(
        publisher: SimKvPublisher, client: Client) -> None:
    payloads = [msgspec.msgpack.encode(batch(float(seq), _event(REMOVED, 16)))
                for seq in range(3)]
    for seq in range(3):
        publisher.publish(float(seq), [REMOVED], 16)
    end = [b"", b"", END_SEQ, b""]
    assert await client.replay(b"", seq_bytes(1)) == [
        [b"", b"", seq_bytes(1), payloads[1]], [b"", b"", seq_bytes(2), payloads[2]], end]
    assert await client.replay(b"", seq_bytes(0)) == [
        *([b"", b"", seq_bytes(seq), payloads[seq]] for seq in range(3)), end]
    assert await client.replay(b"", seq_bytes(3)) == [end]


async def test_a_request_of_the_wrong_shape_is_ignored_and_the_next_answered(
        publisher: SimKvPublisher, client: Client) -> None:
    publisher.publish(1.0, [], 16)
    await client.dealer.send_multipart([b"", seq_bytes(0), b"extra"])
    await client.dealer.send_multipart([seq_bytes(0)])
    assert await client.replay(b"", seq_bytes(0)) == [
        [b"", b"", seq_bytes(0), msgspec.msgpack.encode(batch(1.0))], [b"", b"", END_SEQ, b""]]


async def test_a_restart_starts_the_sequence_again_with_an_empty_buffer(
        publisher: SimKvPublisher, client: Client) -> None:
    for _ in range(3):
        publisher.publish(1.0, [], 16)
    publisher.restart()
    assert (publisher.seq, list(publisher.buffer)) == (0, [])
    assert await client.replay(b"", seq_bytes(0)) == [[b"", b"", END_SEQ, b""]]
    publisher.publish(2.0, [], 16)
    assert [frames[2] for frames in await client.replay(b"", seq_bytes(0))] == [
        seq_bytes(0), END_SEQ]


def test_the_replay_buffer_keeps_vllms_ten_thousand_latest_batches() -> None:
    unstarted = SimKvPublisher()  # buffered only: nothing listens yet
    for _ in range(10_001):
        unstarted.publish(0.0, [], 16)
    assert [seq for seq, _ in unstarted.buffer] == list(range(1, 10_001))
    assert unstarted.seq == 10_001


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("given", [False, True])
async def test_it_listens_on_the_ports_or_the_sockets_it_is_given(given: bool) -> None:
    if given:
        listeners = (socket.create_server(("127.0.0.1", 0)),
                     socket.create_server(("127.0.0.1", 0)))
        ports = tuple(s.getsockname()[1] for s in listeners)
        publisher = SimKvPublisher()
        await publisher.start(listeners)
        assert [s.fileno() for s in listeners] == [-1, -1]  # ZeroMQ took them over
    else:
        ports = (free_port(), free_port())
        publisher = SimKvPublisher(*ports)
        await publisher.start()
    client = Client(publisher)
    try:
        assert (publisher.port, publisher.replay_port) == ports
        assert (publisher.url, publisher.replay_url) == tuple(
            f"tcp://127.0.0.1:{port}" for port in ports)
        publisher.publish(3.0, [], 16)
        assert [frames[2] for frames in await client.replay(b"", seq_bytes(0))] == [
            seq_bytes(0), END_SEQ]
        await client.subscribed(publisher)
    finally:
        client.close()
        await publisher.stop()


async def test_ephemeral_ports_differ_and_stop_closes_them(publisher: SimKvPublisher) -> None:
    ports = (publisher.port, publisher.replay_port)
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert all(low <= port <= high for port in ports) and ports[0] != ports[1]
    await publisher.stop()
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S).close()
    await publisher.start()  # the fixture stops it again


async def test_stopping_a_publisher_that_never_started_does_nothing() -> None:
    await SimKvPublisher().stop()


async def test_stop_ends_the_replay_task_before_it_returns() -> None:
    publisher = SimKvPublisher()
    await publisher.start()
    assert len(asyncio.all_tasks()) == 2  # this test and the replay server
    await publisher.stop()
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_a_subscriber_that_reads_nothing_loses_batches_but_never_blocks_the_engine(
        publisher: SimKvPublisher, client: Client) -> None:
    """ZeroMQ's PUB drops what a slow subscriber's queue cannot take (vLLM's does too):
    publishing goes on, and the replay buffer still has every batch."""
    client.sub.setsockopt(zmq.RCVHWM, 1)
    await client.subscribed(publisher)
    first = publisher.seq
    for _ in range(20_000):
        publisher.publish(0.0, [REMOVED], 16)
    assert publisher.seq == first + 20_000
    assert [seq for seq, _ in publisher.buffer][-1] == first + 19_999
