"""Poller benchmark: client CPU per scrape of kvtop's poller (aiohttp).

Run: ``python -m benchmarks.bench_poller [--targets 50,200] [--seconds 10] [--static]``. A
server in a separate process answers with vLLM 0.33's two routes (``metrics_server.py``; its
CPU is not counted): bodies of a simulated vLLM 0.33 under load that change every scrape,
or with ``--static`` the real 48.6 KB twin scrape. kvtop's ``Poller`` reads N targets at
1 Hz for the given time, narrowed (kvtop's default: ``/metrics/?name[]=…``, ~10 KB,
gzipped) and whole (``--full-metrics``: ``/metrics``, ~48 KB plain), and
``resource.getrusage`` (user + system, this process only) is divided by the scrapes done.
Prints a markdown table, with what 500 targets at 1 Hz would cost.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

from benchmarks.metrics_server import moving_bodies, start_server, static_body
from benchmarks.quick import parse_args, quick_option
from kvtop.collect.poller import Poller
from kvtop.collect.target import Scrape, Target
from kvtop.runtime import tune_gc

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
    parser.add_argument("--static", action="store_true",
                        help="serve the real twin scrape, the same every time")
    quick_option(parser, targets="5", seconds=1.0)
    args = parse_args(parser)
    tune_gc()  # as every kvtop command does
    bodies = static_body() if args.static else moving_bodies()
    counts = [int(x) for x in args.targets.split(",")]
    # every row's requests, narrowed retries included, walk a fresh stretch of the bodies
    process, port = start_server(bodies, run_s=int(2 * len(counts) * (args.seconds + 2)))
    try:
        kind = "the same twin scrape" if args.static else "moving simulated vLLM 0.33 bodies"
        print(f"{kind}, {len(bodies[-1]):,} bytes; {args.seconds:g} s at 1 Hz per row; "
              "client CPU only\n")
        print("| read | targets | scrapes | failed | CPU ms/scrape | 500 targets @1 Hz |")
        print("|---|---:|---:|---:|---:|---:|")
        for n in counts:
            for narrow, read in ((True, "narrowed"), (False, "--full-metrics")):
                per, done, failed = asyncio.run(measure(port, n, args.seconds, narrow))
                print(f"| {read} | {n} | {done} | {failed} | {per * 1e3:.2f} | "
                      f"{per * 500:.2f} core |", flush=True)
                time.sleep(0.5)
    finally:
        process.terminate()


if __name__ == "__main__":
    main()
