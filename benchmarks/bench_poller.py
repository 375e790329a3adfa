"""Poller benchmark: client CPU per scrape of kvtop's poller (aiohttp).

Run: ``python benchmarks/bench_poller.py [--targets 50,200] [--seconds 10]``. A server in a
separate process serves the 48.6 KB vLLM 0.33.0 fixture on 127.0.0.1, gzipped (5 KB) as
vLLM serves it to a client that accepts gzip (its CPU is not counted); kvtop's ``Poller``
reads N targets at 1 Hz for the given time, and ``resource.getrusage`` (user + system, this
process only) is divided by the scrapes done. Prints a markdown table, with what 500
targets at 1 Hz would cost.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import multiprocessing
import resource
import socket
import time
from pathlib import Path

from kvtop.collect.poller import Poller
from kvtop.collect.target import Scrape, Target

FIXTURE = (
    Path(__file__).resolve().parents[1].parent
    / "shared/fixtures/metrics/vllm-0.33.0-v1-twin-under-load.txt"
)


# ---------------------------------------------------------------------------- the server


def _serve(body: bytes, sock: socket.socket) -> None:
    """A minimal keep-alive HTTP/1.1 server answering every GET with ``body``, gzipped when
    the client accepts it, as vLLM's prometheus_client does (compressed once, up front:
    the client's CPU is what is measured)."""
    def response(payload: bytes, encoding: str = "") -> bytes:
        head = ("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                f"{encoding}Content-Length: {len(payload)}\r\n\r\n").encode()
        return head + payload

    plain, packed = response(body), response(gzip.compress(body), "Content-Encoding: gzip\r\n")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                writer.write(packed if b"gzip" in request.lower() else plain)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, sock=sock, backlog=1024)
        await server.serve_forever()

    asyncio.run(main())


def start_server(body: bytes) -> tuple[multiprocessing.Process, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    process = multiprocessing.get_context("fork").Process(
        target=_serve, args=(body, sock), daemon=True
    )
    process.start()
    return process, sock.getsockname()[1]


# ---------------------------------------------------------------------------- the client


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(port: int, n: int, seconds: float) -> tuple[float, int, int]:
    """(CPU seconds per scrape, scrapes, failures) for n targets at 1 Hz."""
    targets = [Target(f"http://127.0.0.1:{port}/metrics?t={i}") for i in range(n)]
    counts = {"ok": 0, "failed": 0}

    def on_scrape(s: Scrape) -> None:
        counts["ok" if s.ok else "failed"] += 1

    async with Poller(targets, interval_s=1.0, timeout_s=5.0) as poller:
        await poller.poll_once()  # warm: connections open, CA bundle loaded
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        before = cpu_s()
        await poller.run(on_scrape, stop=stop)
        spent = cpu_s() - before
    done = counts["ok"] + counts["failed"]
    return spent / max(done, 1), done, counts["failed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="50,200", help="comma-separated target counts")
    parser.add_argument("--seconds", type=float, default=10.0, help="run time per measurement")
    args = parser.parse_args()
    body = FIXTURE.read_bytes()
    process, port = start_server(body)
    try:
        print(f"body {len(body):,} bytes; {args.seconds:g} s at 1 Hz per row; client CPU only\n")
        print("| targets | scrapes | failed | CPU ms/scrape | 500 targets @1 Hz |")
        print("|---:|---:|---:|---:|---:|")
        for n in (int(x) for x in args.targets.split(",")):
            per, done, failed = asyncio.run(measure(port, n, args.seconds))
            print(f"| {n} | {done} | {failed} | {per * 1e3:.2f} | {per * 500:.2f} core |",
                  flush=True)
            time.sleep(0.5)
    finally:
        process.terminate()


if __name__ == "__main__":
    main()
