"""The /metrics server the poller and fleet benchmarks read: one process, many targets.

It answers as vLLM 0.33 does (checked against the served twin in tests/twin): the exact
``/metrics`` renders everything, uncompressed (prometheus-fastapi-instrumentator's route);
``/metrics/`` is prometheus_client's handler, gzipped for a client that accepts it and
restricted to the ``name[]`` arguments when there are any. Every answer is made once, up
front or on first use, so the server's CPU stays small next to the client's.

Bodies move like a server's under load: ``moving_bodies`` renders kvtop's vLLM 0.33
simulator once a simulated second under a steady load, and each target (told apart by its
query, e.g. ``?e=17``) walks through them from its own starting point, one per request,
so counters rise, histograms fill and about half the lines change between two scrapes.
``static_body`` is the real 48.6 KB twin scrape, the same every time.
"""

from __future__ import annotations

import asyncio
import gzip
import multiprocessing
import socket
import zlib
from collections.abc import Sequence
from urllib.parse import parse_qs, urlsplit

from benchmarks.paths import METRICS

FIXTURE = METRICS / "vllm-0.33.0-v1-twin-under-load.txt"


def moving_bodies(seconds: int = 300, rate: float = 8.0) -> list[str]:
    """``/metrics`` of a simulated vLLM 0.33 server once a second for ``seconds``."""
    from kvtop.sim.engine import EngineConfig
    from kvtop.sim.exposition import render
    from kvtop.sim.simulation import Simulation
    from kvtop.sim.workloads import make_workload

    engine = EngineConfig(num_gpu_blocks=2000, max_num_seqs=64)
    requests = make_workload("synthetic", seed=1, block_size=engine.block_size, rate=rate)
    simulation = Simulation(engine, requests, (), seed=1)
    simulation.advance_to(60.0)  # past the start, with latency histograms filled
    bodies = []
    for second in range(seconds):
        simulation.advance_to(61.0 + second)
        bodies.append(render(simulation.engine, model_name="sim-llama-3-8b"))
    return bodies


def static_body() -> list[str]:
    return [FIXTURE.read_text(encoding="utf-8")]


def restricted(text: str, names: frozenset[str]) -> str:
    """``text`` as prometheus_client renders it for ``name[]`` arguments: the named samples
    only, each kept family with its HELP/TYPE (a family is a block from its ``# HELP``)."""
    out: list[str] = []
    block: list[str] = []
    kept = False

    def close() -> None:
        if kept:
            out.extend(line for line in block
                       if line.startswith("#") or line.split("{")[0].split(" ")[0] in names)

    for line in text.splitlines():
        if line.startswith("# HELP"):
            close()
            block, kept = [], False
        block.append(line)
        kept |= not line.startswith("#") and line.split("{")[0].split(" ")[0] in names
    close()
    return "\n".join(out) + "\n" if out else ""


def _response(payload: bytes, gzipped: bool) -> bytes:
    encoding = "Content-Encoding: gzip\r\n" if gzipped else ""
    payload = gzip.compress(payload, 6) if gzipped else payload
    head = ("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            f"{encoding}Content-Length: {len(payload)}\r\n\r\n").encode()
    return head + payload


class _Answers:
    """Each target's next answer, made on first use and kept."""

    def __init__(self, bodies: Sequence[str], run_s: int) -> None:
        self.bodies = bodies
        self.spread = max(1, len(bodies) - run_s)  # starting points that never wrap
        self.served: dict[str, int] = {}
        self.made: dict[tuple[int, str, bool], bytes] = {}

    def next(self, request_target: str, accepts_gzip: bool) -> bytes:
        parts = urlsplit(request_target)
        query = parse_qs(parts.query)
        names = frozenset(query.pop("name[]", []))
        who = repr(sorted(query.items()))
        count = self.served.get(who)
        if count is None:
            count = zlib.crc32(who.encode()) % self.spread
        self.served[who] = count + 1
        index = min(count, len(self.bodies) - 1)
        handler = parts.path.endswith("/")
        key = (index, ",".join(sorted(names)) if handler else "", handler and accepts_gzip)
        answer = self.made.get(key)
        if answer is None:
            text = self.bodies[index]
            payload = restricted(text, names) if handler and names else text
            answer = self.made[key] = _response(payload.encode(), key[2])
        return answer


def _serve(bodies: Sequence[str], run_s: int, sock: socket.socket) -> None:
    answers = _Answers(bodies, run_s)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                target = request.split(b" ", 2)[1].decode()
                writer.write(answers.next(target, b"gzip" in request.lower()))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, sock=sock, backlog=1024)
        await server.serve_forever()

    asyncio.run(main())


def start_server(bodies: Sequence[str], run_s: int = 120) -> tuple[multiprocessing.Process, int]:
    """Serve ``bodies`` from a separate process; each target's walk through them does not
    run out within ``run_s`` requests. Returns (process, port)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    process = multiprocessing.get_context("fork").Process(
        target=_serve, args=(bodies, run_s, sock), daemon=True
    )
    process.start()
    return process, sock.getsockname()[1]
