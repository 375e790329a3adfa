"""A source of KV event batches: vLLM's ZeroMQ publisher, one socket per data-parallel rank.

vLLM's ``ZmqEventPublisher`` sends ``(topic, seq, payload)`` on a PUB socket per rank (the
endpoint's port plus the rank) and keeps its last batches for replay on a ROUTER socket (the
replay port plus the rank): a ``(b"", start_seq)`` request is answered with every buffered
batch from ``start_seq`` on, then an end marker (seq -1). kvtop subscribes to every rank,
delivers each batch in sequence order through ``on_batch``, and keeps the order whole:

* **joining**: the first batch seen starts a replay from 0, so blocks stored before kvtop
  connected are learned as far as the publisher's buffer reaches (``first_seq`` says where);
* **a gap** (a sequence number skipped: the publisher's high-water mark dropped batches
  for a slow reader, a reconnect) is filled from the replay socket; what replay does not
  have is delivered as ``lost`` on the next batch (the index then starts over: derive);
* **a restart** (the sequence goes back) is delivered as ``restart``;
* **hostile input**: a message over ``MAX_PAYLOAD_BYTES`` is refused by ZeroMQ itself (it
  drops that connection: the gap after it shows as lost); a frame that is not
  ``(topic, 8-byte seq, payload)`` is counted and skipped; a payload that does not decode is
  delivered as a malformed batch (collect/kv_events.py). Memory is bounded by ``RCV_HWM``
  messages of at most ``MAX_PAYLOAD_BYTES`` per socket, and a replay by ``MAX_REPLAY``
  batches and ``REPLAY_TIMEOUT_S``.

docs/kv-anatomy.md describes the states; docs/security.md the limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from kvtop.collect.kv_endpoint import KvEventsEndpoint, RankStatus
from kvtop.collect.kv_events import MAX_PAYLOAD_BYTES, KvEventBatch, decode_batch

RCV_HWM = 64  # messages a socket queues before the publisher drops (a gap, then replay)
MAX_REPLAY = 20_000  # batches one replay may return (vLLM keeps 10,000 by default)
REPLAY_TIMEOUT_S = 2.0  # for the whole answer
END_SEQ = -1  # the replay's end marker
BURST = 256  # messages read from one socket before the loop yields
# ZeroMQ does not reconnect a peer it dropped for a message over MAXMSGSIZE: a connection
# still down this long after it dropped is made again by hand.
RECONNECT_S = 1.0

OnBatch = Callable[[KvEventBatch], None]


@dataclass(slots=True)
class _Rank:
    status: RankStatus
    sub: zmq.asyncio.Socket
    monitor: zmq.asyncio.Socket
    url: str
    reconnect_at: float | None = None
    replay: zmq.asyncio.Socket | None = None
    replay_url: str | None = None
    pending_restart: bool = False  # the next batch delivered carries ``restart``


class KvEventsSubscriber:
    """Subscribes to every rank of ``endpoint`` while :meth:`run` runs."""

    def __init__(self, endpoint: KvEventsEndpoint, on_batch: OnBatch, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.endpoint = endpoint
        self.on_batch = on_batch
        self.clock = clock
        # made now, so a channel can show them before the sockets open
        self.statuses = [RankStatus(r) for r in range(endpoint.ranks)]
        self._ctx: zmq.asyncio.Context | None = None
        self._ranks: list[_Rank] = []

    def status(self) -> list[RankStatus]:
        return [rank.status for rank in self._ranks]

    async def run(self, stop: asyncio.Event) -> None:
        self._ctx = zmq.asyncio.Context()
        try:
            self._ranks = [self._open(r) for r in range(self.endpoint.ranks)]
            poller = zmq.asyncio.Poller()
            for rank in self._ranks:
                poller.register(rank.sub, zmq.POLLIN)
                poller.register(rank.monitor, zmq.POLLIN)
            while not stop.is_set():
                ready = dict(await poller.poll(timeout=100))
                for rank in self._ranks:
                    if rank.monitor in ready:
                        await self._monitor(rank)
                    if rank.sub in ready:
                        await self._read(rank)
                    self._reconnect(rank)
        finally:
            # every socket of the context, those of a rank that failed to open too: one
            # left open would hold term() forever
            self._ctx.destroy(linger=0)

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        assert self._ctx is not None
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.RCVHWM, RCV_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD_BYTES + 64)
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    def _open(self, r: int) -> _Rank:
        endpoint = self.endpoint
        sub = self._socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, endpoint.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED
                                         | zmq.EVENT_DISCONNECTED)
        url = endpoint.rank_url(endpoint.url, r)
        if endpoint.bind:
            sub.bind(url)
        else:
            sub.connect(url)
        replay = None if endpoint.replay is None else endpoint.rank_url(endpoint.replay, r)
        return _Rank(self.statuses[r], sub, monitor, url, replay_url=replay)

    async def _monitor(self, rank: _Rank) -> None:
        with contextlib.suppress(zmq.Again):
            while True:
                event = parse_monitor_message(await rank.monitor.recv_multipart(zmq.NOBLOCK))
                if event["event"] in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                    rank.status.state = "connected"
                    rank.reconnect_at = None
                elif event["event"] == zmq.EVENT_DISCONNECTED:
                    rank.status.state = "disconnected"
                    rank.reconnect_at = time.monotonic() + RECONNECT_S

    def _reconnect(self, rank: _Rank) -> None:
        """Connect again where ZeroMQ gave up (a peer dropped for a message too large)."""
        if rank.reconnect_at is None or time.monotonic() < rank.reconnect_at:
            return
        rank.reconnect_at = time.monotonic() + RECONNECT_S
        if not self.endpoint.bind:  # a listening socket takes the next connection itself
            with contextlib.suppress(zmq.ZMQError):
                rank.sub.disconnect(rank.url)
            rank.sub.connect(rank.url)

    async def _read(self, rank: _Rank) -> None:
        for _ in range(BURST):
            try:
                frames = await rank.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            await self._message(rank, frames)
        await asyncio.sleep(0)  # a flood never starves the rest of the loop

    async def _message(self, rank: _Rank, frames: list[bytes]) -> None:
        status = rank.status
        if len(frames) != 3 or len(frames[1]) != 8:
            status.bad_frames += 1
            return
        seq, last, lost = int.from_bytes(frames[1], "big"), status.last_seq, 0
        if last is None or seq < last:
            if last is not None:
                status.restarts += 1
                rank.pending_restart = True
            await self._catch_up(rank, 0, seq, first=True)
        elif seq == last:
            return  # the same batch again: nothing new
        elif seq > last + 1:
            status.gaps += 1
            lost = await self._catch_up(rank, last + 1, seq, first=False)
        self._deliver(rank, seq, frames[2], lost)

    async def _catch_up(self, rank: _Rank, start: int, upto: int, *, first: bool) -> int:
        """Deliver the batches start..upto-1 that replay has; the count it lacks before
        ``upto``. On a first batch (or a restart) what replay lacks is before kvtop
        listened, not lost: delivery starts at the oldest batch replay has."""
        replayed = await self._replay(rank, start, upto) if upto > start else []
        if first and not replayed:
            return 0
        expected = replayed[0][0] if first else start
        for seq, payload in replayed:
            self._deliver(rank, seq, payload, seq - expected)
            rank.status.recovered += 0 if first else 1
            expected = seq + 1
        return upto - expected

    async def _replay(self, rank: _Rank, start: int, upto: int) -> list[tuple[int, bytes]]:
        """Batches start..upto-1 that the replay socket still has, in order."""
        if rank.replay_url is None:
            return []
        if rank.replay is None:
            rank.replay = self._socket(zmq.DEALER)
            rank.replay.connect(rank.replay_url)
        sock, got = rank.replay, {}

        async def answer() -> bool:
            """Whether the answer ended with its end marker within MAX_REPLAY batches."""
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            for _ in range(MAX_REPLAY + 1):
                frames = await sock.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    rank.status.bad_frames += 1
                    continue
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == END_SEQ:
                    return True
                if start <= seq < upto:
                    got[seq] = frames[3]
            return False

        try:
            whole = await asyncio.wait_for(answer(), REPLAY_TIMEOUT_S)
        except (asyncio.TimeoutError, zmq.ZMQError):
            whole = False
        if not whole:
            rank.status.replay_failures += 1
            # the rest of this answer (a late one, or the tail past MAX_REPLAY) must not be
            # read as the next replay's: the socket goes with it
            sock.close(linger=0)
            rank.replay = None
        return sorted(got.items())

    def _deliver(self, rank: _Rank, seq: int, payload: bytes, lost: int) -> None:
        status = rank.status
        decoded = decode_batch(payload)
        now = self.clock()
        batch = KvEventBatch(
            t=now, rank=status.rank, seq=seq, ts=decoded.ts, events=tuple(decoded.events),
            unknown=decoded.unknown, malformed=decoded.problem is not None, lost=max(0, lost),
            restart=rank.pending_restart, problem=decoded.problem)
        rank.pending_restart = False
        status.batches += 1
        status.lost += batch.lost
        status.malformed += batch.malformed
        status.last_seq, status.last_t = seq, now
        if status.first_seq is None:
            status.first_seq = seq
        self.on_batch(batch)
