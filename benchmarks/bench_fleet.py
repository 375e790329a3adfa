"""Fleet benchmark: 500 engines read directly at 1 Hz vs through Prometheus, side by side.

Run: ``python -m benchmarks.bench_fleet [--engines 500] [--seconds 30] [--scrape 15]
[--static]`` (needs the ``prometheus`` binary). One server process answers for all N
engines with vLLM 0.33's two routes (``metrics_server.py``): bodies of a simulated vLLM
0.33 under load that change every scrape (``--static``: the real 48.6 KB twin scrape);
Prometheus scrapes the N instances' ``/metrics`` every ``--scrape`` seconds. Meanwhile
three kvtop processes run headless, one after the other so that they don't compete for the
CPU, each with one ``TargetTracker`` (adapters + leak detector) per engine: two poll the
N targets themselves at 1 Hz (``Poller``), narrowed as kvtop does by default and whole as
with ``--full-metrics``; the third reads them through Prometheus (``PrometheusSource`` at
kvtop's default refresh, after its backfill). CPU is user + system over each one's window;
RSS at its end; Prometheus's CPU over all three. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.metrics_server import moving_bodies, start_server, static_body
from benchmarks.quick import parse_args, quick_option
from kvtop.collect.poller import Poller
from kvtop.collect.prometheus import PROMETHEUS_INTERVAL_S, PrometheusSource, load_settings
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from kvtop.runtime import tune_gc

WARMUP_S = 5.0


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mb_self() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of another process (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _measure(source: Any, seconds: float) -> dict[str, float]:
    trackers: dict[str, TargetTracker] = {}
    counts = {"scrapes": 0, "failed": 0, "backfill_s": 0.0}

    def on_scrape(scrape: Scrape) -> None:
        tracker = trackers.get(scrape.target.url)
        if tracker is None:
            tracker = trackers[scrape.target.url] = TargetTracker(scrape.target)
        tracker.update(scrape)
        counts["scrapes" if scrape.ok else "failed"] += 1

    started = time.monotonic()
    if isinstance(source, PrometheusSource):
        for scrape in await source.backfill():
            on_scrape(scrape)
        counts["backfill_s"] = time.monotonic() - started
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(on_scrape, stop=stop))
    await asyncio.sleep(WARMUP_S)
    before, scrapes_before, t0 = _cpu_self(), counts["scrapes"], time.monotonic()
    await asyncio.sleep(seconds)
    spent, wall = _cpu_self() - before, time.monotonic() - t0
    stop.set()
    await task
    return {"cores": spent / wall, "rss_mb": _rss_mb_self(), "engines": len(trackers),
            "scrapes_per_s": (counts["scrapes"] - scrapes_before) / wall,
            "failed": counts["failed"], "backfill_s": counts["backfill_s"],
            "requests": getattr(getattr(source, "api", None), "requests", 0)}


def _direct(port: int, n: int, seconds: float, out: Any, narrow: bool) -> None:
    tune_gc()  # as every kvtop command does

    async def main() -> dict[str, float]:
        targets = [Target(f"http://127.0.0.1:{port}/metrics?e={i}") for i in range(n)]
        async with Poller(targets, interval_s=1.0, timeout_s=5.0, narrow=narrow) as poller:
            return await _measure(poller, seconds)
    out.put(("narrowed" if narrow else "full", asyncio.run(main())))


def _through(url: str, seconds: float, out: Any, interval_s: float) -> None:
    tune_gc()

    async def main() -> dict[str, float]:
        source = PrometheusSource(load_settings(url), interval_s=interval_s)
        async with source:
            return await _measure(source, seconds)
    out.put(("prometheus", asyncio.run(main())))


def _prometheus_yml(port: int, n: int, scrape_s: float) -> str:
    entries = "".join(f"      - targets: ['127.0.0.1:{port}']\n"
                      f"        labels: {{instance: 'engine-{i:03d}', __param_e: '{i}'}}\n"
                      for i in range(n))
    return (f"global:\n  scrape_interval: {scrape_s:g}s\n"
            f"  scrape_timeout: {min(5.0, scrape_s):g}s\n"  # Prometheus: at most the interval
            f"scrape_configs:\n  - job_name: vllm\n    static_configs:\n{entries}")


def _wait_up(url: str, n: int, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            result = httpx.post(f"{url}/api/v1/query", data={"query": "count(up == 1)"},
                                timeout=5).json()["data"]["result"]
            if result and int(float(result[0]["value"][1])) >= n:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"Prometheus did not scrape all {n} targets within {limit_s:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--scrape", type=float, default=15.0,
                        help="Prometheus scrape interval, seconds (default 15)")
    parser.add_argument("--prom-interval", type=float, default=PROMETHEUS_INTERVAL_S,
                        help="kvtop's refresh through Prometheus, seconds (kvtop's default)")
    parser.add_argument("--static", action="store_true",
                        help="serve the real twin scrape, the same every time")
    quick_option(parser, engines=10, seconds=2.0, scrape=1.0, prom_interval=1.0)
    args = parse_args(parser)
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("needs the 'prometheus' binary (apt-get install prometheus)")
    # Requests per engine over the whole run: two direct runs at 1 Hz, and Prometheus's
    # scrapes from its start to the end of the third run.
    wall_s = 3 * args.scrape + 30 + 2 * args.scrape + 3 * (WARMUP_S + args.seconds + 20)
    run_s = int(2 * (WARMUP_S + args.seconds + 10) + wall_s / args.scrape)
    bodies = static_body() if args.static else moving_bodies(seconds=run_s + 60)
    server, port = start_server(bodies, run_s=run_s)
    tmp = Path(tempfile.mkdtemp(prefix="kvtop-bench-"))
    (tmp / "prometheus.yml").write_text(_prometheus_yml(port, args.engines, args.scrape))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    prom_port = sock.getsockname()[1]
    sock.close()
    prom = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{prom_port}"
    try:
        _wait_up(url, args.engines, 3 * args.scrape + 30)
        time.sleep(2 * args.scrape)  # a few scrapes stored: what the backfill reads
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        results, before, t0 = {}, proc_cpu_s(prom.pid), time.monotonic()
        # One after the other: on a small machine the two would slow each other down.
        runs = ((_direct, (port, args.engines, args.seconds, out, True)),
                (_direct, (port, args.engines, args.seconds, out, False)),
                (_through, (url, args.seconds, out, args.prom_interval)))
        for work, work_args in runs:
            worker = context.Process(target=work, args=work_args)
            worker.start()
            name, result = out.get(timeout=args.seconds + 180)
            results[name] = result
            worker.join()
        prom_cores = (proc_cpu_s(prom.pid) - before) / (time.monotonic() - t0)
        prom_rss = _proc_rss_mb(prom.pid)
    finally:
        prom.terminate()
        prom.wait(10)
        server.terminate()
        shutil.rmtree(tmp, ignore_errors=True)
    _print(args, results, prom_cores, prom_rss, len(bodies[-1]))


def _print(args: argparse.Namespace, results: dict[str, dict[str, float]], prom_cores: float,
           prom_rss: float, body_bytes: int) -> None:
    through = results["prometheus"]
    bodies = "the same twin scrape" if args.static else "moving simulated vLLM 0.33 bodies"
    print(f"{args.engines} engines ({bodies}, {body_bytes / 1000:.1f} KB whole), Prometheus "
          f"scrape interval {args.scrape:g} s, {args.seconds:g} s measured\n")
    print("| process | reads | engine updates/s | CPU (cores) | RSS MB | notes |")
    print("|---|---|---:|---:|---:|---|")
    for key, reads in (("narrowed", "1 Hz poll of each engine, narrowed (default)"),
                       ("full", "1 Hz poll of each engine, `--full-metrics`")):
        direct = results[key]
        print(f"| kvtop, direct | {reads} | {direct['scrapes_per_s']:.0f} | "
              f"{direct['cores']:.3f} | {direct['rss_mb']:.0f} | goal < 0.5 core |")
    print(f"| kvtop, through Prometheus | 2 queries every {args.prom_interval:g} s for the fleet | "
          f"{through['scrapes_per_s']:.0f} | {through['cores']:.3f} | {through['rss_mb']:.0f} | "
          f"goal < 0.05 core; backfill {through['backfill_s']:.1f} s once |")
    print(f"| Prometheus | scrapes every {args.scrape:g} s | "
          f"{args.engines / args.scrape:.0f} | {prom_cores:.3f} | {prom_rss:.0f} | |")


if __name__ == "__main__":
    main()
