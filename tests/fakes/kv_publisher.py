"""A KV-event publisher speaking vLLM 0.33's wire protocol (vllm/distributed/kv_events.py),
with the faults a test needs: batches skipped (as a high-water mark drops them), a replay
buffer that forgets, a replay that does not answer or answers frames of the wrong shape, a
restart, raw frames of any shape.

Protocol: a PUB socket sends ``(topic, seq as 8 bytes big-endian, msgpack payload)``; a ROUTER
socket answers ``(identity, b"", start_seq)`` with ``(identity, b"", topic, seq, payload)``
for every buffered batch with ``seq >= start_seq``, then ``(identity, b"", b"", -1, b"")``.
Payloads are encoded with msgspec as vLLM does: ``[ts, [event, ...], rank]``, each event a
map tagged ``"type"`` (``array_events=True``: the array form of earlier releases).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def stored(hashes: Iterable[int | bytes], parent: int | bytes | None = None, *,
           tokens: int = 16, block_size: int = 16, medium: str | None = "GPU",
           group: int | None = 0) -> dict[str, Any]:
    hashes = list(hashes)
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": list(range(tokens * len(hashes))), "block_size": block_size,
            "lora_id": None, "medium": medium, "lora_name": None, "group_idx": group}


def removed(hashes: Iterable[int | bytes], *, medium: str | None = "GPU",
            group: int | None = 0) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium,
            "group_idx": group}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def as_array(event: dict[str, Any]) -> list[Any]:
    """The array form (vLLM before the map form): tag, then the fields in order."""
    order = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                             "lora_id", "medium"),
             "BlockRemoved": ("block_hashes", "medium"), "AllBlocksCleared": ()}
    return [event["type"], *(event[name] for name in order[event["type"]])]


def payload(events: list[Any], *, ts: float | None = None, rank: int | None = 0) -> bytes:
    return msgspec.msgpack.encode([time.time() if ts is None else ts, events, rank])


class KvPublisher:
    """PUB on ``tcp://127.0.0.1:<port>``, ROUTER replay beside it, serviced by a thread."""

    def __init__(self, *, replay: bool = True, buffer: int = 10_000, hwm: int = 100_000,
                 port: int = 0, replay_port: int = 0) -> None:
        self.ctx = zmq.Context()
        try:
            self._open(hwm, port, replay, replay_port)
        except zmq.ZMQError:
            # a port taken: a context collected with a socket still open blocks in term(),
            # which hung whichever test ran next
            self.ctx.destroy(linger=0)
            raise
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self.seq = 0
        self.replay_requests: list[int] = []
        self.replay_clients: list[bytes] = []  # the identity each request came from
        self.replay_silent = 0  # replay requests to leave unanswered (a publisher too busy)
        self.replay_junk: list[list[bytes]] = []  # frames sent before each answer's batches
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if replay:
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def _open(self, hwm: int, port: int, replay: bool, replay_port: int) -> None:
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, hwm)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self._bind(self.pub, port)
        self.router: zmq.Socket | None = None
        self.replay_port: int | None = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.replay_port = self._bind(self.router, replay_port)

    @staticmethod
    def _bind(sock: zmq.Socket, port: int) -> int:
        if port:
            sock.bind(f"tcp://127.0.0.1:{port}")
            return port
        return sock.bind_to_random_port("tcp://127.0.0.1")

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_url(self) -> str | None:
        return None if self.replay_port is None else f"tcp://127.0.0.1:{self.replay_port}"

    def publish(self, events: list[Any], *, send: bool = True, raw: bytes | None = None,
                ts: float | None = None) -> int:
        """Publish the next batch (``send=False``: buffered for replay only, as a batch the
        high-water mark dropped); its sequence number."""
        data = raw if raw is not None else payload(events, ts=ts)
        with self._lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, data))
            if send:
                self.pub.send_multipart([b"", seq.to_bytes(8, "big"), data])
        return seq

    def send_frames(self, frames: list[bytes]) -> None:
        with self._lock:
            self.pub.send_multipart(frames)

    def restart(self) -> None:
        """A new publisher process: the sequence starts at 0, the buffer is empty."""
        with self._lock:
            self.seq = 0
            self.buffer.clear()

    def forget(self, upto: int) -> None:
        """The replay buffer no longer has batches before ``upto``."""
        with self._lock:
            while self.buffer and self.buffer[0][0] < upto:
                self.buffer.popleft()

    def _serve_replay(self) -> None:
        assert self.router is not None
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            self.replay_clients.append(client)
            if self.replay_silent:
                self.replay_silent -= 1
                continue
            for junk in self.replay_junk:
                self.router.send_multipart([client, *junk])
            with self._lock:
                answer = [(s, d) for s, d in self.buffer if s >= first]
            for seq, data in answer:
                self.router.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), data])
            self.router.send_multipart([client, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        if self.router is not None:
            self._thread.join(2)
            self.router.close(0)
        self.pub.close(0)
        self.ctx.term()
