"""Poller benchmark: client CPU per scrape of kvtop's poller (aiohttp).

Run: ``python benchmarks/bench_poller.py [--targets 50,200] [--seconds 10]``. A server in a
separate process serves the 48.6 KB vLLM 0.33.0 fixture on 127.0.0.1 with vLLM 0.33's two
routes (see ``_serve``; its CPU is not counted). kvtop's ``Poller`` reads N targets at 1 Hz
for the given time, narrowed (kvtop's default: ``/metrics/?name[]=…``, 10 KB, gzipped) and
whole (``--full-metrics``: ``/metrics``, 48.6 KB plain), and ``resource.getrusage`` (user +
system, this process only) is divided by the scrapes done. Prints a markdown table, with
what 500 targets at 1 Hz would cost.
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
from urllib.parse import parse_qs, urlsplit

from kvtop.collect.poller import Poller
from kvtop.collect.target import Scrape, Target

FIXTURE = (
    Path(__file__).resolve().parents[1].parent
    / "shared/fixtures/metrics/vllm-0.33.0-v1-twin-under-load.txt"
)


# ---------------------------------------------------------------------------- the server


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


def _serve(body: bytes, sock: socket.socket) -> None:
    """A minimal keep-alive HTTP/1.1 server with vLLM 0.33's two metrics routes, each
    answer made once up front (the client's CPU is what is measured): the exact
    ``/metrics`` renders everything, uncompressed (prometheus-fastapi-instrumentator);
    ``/metrics/`` is prometheus_client's handler, gzipped for a client that accepts it
    and restricted to the ``name[]`` arguments when there are any."""
    def response(payload: bytes, gzipped: bool) -> bytes:
        encoding = "Content-Encoding: gzip\r\n" if gzipped else ""
        payload = gzip.compress(payload) if gzipped else payload
        head = ("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                f"{encoding}Content-Length: {len(payload)}\r\n\r\n").encode()
        return head + payload

    text = body.decode()
    answers: dict[tuple[str, bool], bytes] = {}

    def answer(target: str, accepts_gzip: bool) -> bytes:
        parts = urlsplit(target)
        names = frozenset(parse_qs(parts.query).get("name[]", []))
        handler = parts.path.endswith("/")
        key = ("/" + ",".join(sorted(names)) if handler else "", handler and accepts_gzip)
        if key not in answers:
            payload = restricted(text, names).encode() if handler and names else body
            answers[key] = response(payload, key[1])
        return answers[key]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                target = request.split(b" ", 2)[1].decode()
                writer.write(answer(target, b"gzip" in request.lower()))
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


async def measure(port: int, n: int, seconds: float, narrow: bool) -> tuple[float, int, int]:
    """(CPU seconds per scrape, scrapes, failures) for n targets at 1 Hz."""
    targets = [Target(f"http://127.0.0.1:{port}/metrics?t={i}") for i in range(n)]
    counts = {"ok": 0, "failed": 0}

    def on_scrape(s: Scrape) -> None:
        counts["ok" if s.ok else "failed"] += 1

    async with Poller(targets, interval_s=1.0, timeout_s=5.0, narrow=narrow) as poller:
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
        print("| read | targets | scrapes | failed | CPU ms/scrape | 500 targets @1 Hz |")
        print("|---|---:|---:|---:|---:|---:|")
        for n in (int(x) for x in args.targets.split(",")):
            for narrow, read in ((True, "narrowed"), (False, "--full-metrics")):
                per, done, failed = asyncio.run(measure(port, n, args.seconds, narrow))
                print(f"| {read} | {n} | {done} | {failed} | {per * 1e3:.2f} | "
                      f"{per * 500:.2f} core |", flush=True)
                time.sleep(0.5)
    finally:
        process.terminate()


if __name__ == "__main__":
    main()
