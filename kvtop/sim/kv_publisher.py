"""A simulated engine's KV events on ZeroMQ, as vLLM publishes them (``--kv-events-config``
with the zmq publisher, vllm/distributed/kv_events.py 0.33): a PUB socket sending
``(topic, seq, msgpack batch)`` per engine step that changed the prefix cache, and a ROUTER
replay socket answering ``(b"", start_seq)`` with every buffered batch from ``start_seq`` on,
then the end marker. Both listen on 127.0.0.1 only.

A restart of the simulated server is a new publisher: its sequence starts at 0 again and its
replay buffer is empty, as a restarted vLLM's.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from kvtop.sim.blocks import PoolEvent

HOST = "127.0.0.1"
BUFFER_STEPS = 10_000  # vLLM's default replay buffer
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def _event(event: PoolEvent, block_size: int) -> dict[str, Any]:
    if event[0] == "S":
        _, hashes, parent = event
        return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
                "token_ids": [0] * (block_size * len(hashes)), "block_size": block_size,
                "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0}
    return {"type": "BlockRemoved", "block_hashes": [event[1]], "medium": "GPU",
            "group_idx": 0}


class SimKvPublisher:
    """Publishes batches while :meth:`start` … :meth:`stop`; ``port`` 0 is ephemeral."""

    def __init__(self, port: int = 0, replay_port: int = 0) -> None:
        self.port, self.replay_port = port, replay_port
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=BUFFER_STEPS)
        self._encoder = msgspec.msgpack.Encoder()
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"tcp://{HOST}:{self.port}"

    @property
    def replay_url(self) -> str:
        return f"tcp://{HOST}:{self.replay_port}"

    async def start(self, listeners: tuple[socket.socket, socket.socket] | None = None) -> None:
        """Listen on the config's ports, or on ``listeners`` (the publisher's and the replay
        socket's, bound and listening already: the demo names them before it starts)."""
        self._ctx = zmq.asyncio.Context()
        pub, replay = listeners or (None, None)
        self._pub, self.port = self._bound(zmq.PUB, self.port, pub)
        self._router, self.replay_port = self._bound(zmq.ROUTER, self.replay_port, replay)
        self._task = asyncio.create_task(self._serve_replay())

    def _bound(self, kind: int, port: int,
               listener: socket.socket | None) -> tuple[zmq.asyncio.Socket, int]:
        assert self._ctx is not None
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if listener is not None:  # ZeroMQ takes the socket over, and closes it
            port = listener.getsockname()[1]
            sock.setsockopt(zmq.USE_FD, listener.fileno())
            sock.bind(f"tcp://{HOST}:{port}")
            listener.detach()
            return sock, port
        if port:
            sock.bind(f"tcp://{HOST}:{port}")
            return sock, port
        return sock, sock.bind_to_random_port(f"tcp://{HOST}")

    def restart(self) -> None:
        self.seq = 0
        self.buffer.clear()

    def publish(self, ts: float, events: Iterable[PoolEvent], block_size: int) -> None:
        payload = self._encoder.encode([ts, [_event(e, block_size) for e in events], 0])
        seq, self.seq = self.seq, self.seq + 1
        self.buffer.append((seq, payload))
        if self._pub is not None:  # PUB never blocks: a full subscriber queue drops it
            self._pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    async def _serve_replay(self) -> None:
        assert self._router is not None
        router = self._router
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await router.send_multipart([client, b"", b"", seq.to_bytes(8, "big"),
                                                 payload])
            await router.send_multipart([client, b"", b"", END_SEQ, b""])

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
