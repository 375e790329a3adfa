"""What one scrape costs the vLLM server: its API process's CPU per /metrics request.

Run: ``python -m benchmarks.bench_server_cost [--requests 300]`` (needs the twin venv,
``scripts/install-twin.sh``). Starts a served vLLM 0.33.0 twin (``tests/twin``: the real
``vllm serve`` with a fake executor, idle), then asks it ``--requests`` times, one request
at a time, for: the whole ``/metrics`` (what a plain scraper and ``kvtop --full-metrics``
read), and kvtop's narrowed read (``/metrics/?name[]=…`` with the vLLM adapter's names,
gzipped as kvtop asks). The API server's user + system CPU (/proc) over each batch, minus
its idle CPU over the same time, divided by the requests; bytes per answer as sent.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import http.client
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks.bench_fleet import proc_cpu_s
from benchmarks.quick import parse_args, quick_option
from kvtop.collect.adapters import vllm
from kvtop.collect.poller import narrowed_url
from twin.serve import TwinServer, TwinSpec, import_vllm_error, twin_python


def _batch(url: str, requests: int, gzip: bool) -> tuple[float, int]:
    """(wall seconds, bytes of the last answer) for ``requests`` GETs on one connection."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = {"Accept-Encoding": "gzip"} if gzip else {}
    started, size = time.monotonic(), 0
    for _ in range(requests):
        connection.request("GET", target, headers=headers)
        answer = connection.getresponse()
        size = len(answer.read())
        assert answer.status == 200, answer.status
    connection.close()
    return time.monotonic() - started, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    quick_option(parser, requests=10)
    args = parse_args(parser)
    python = twin_python()
    work = Path(tempfile.mkdtemp(prefix="kvtop-server-cost-"))
    reason = import_vllm_error(python, work / "model") if python.exists() else "no twin venv"
    if reason:
        raise SystemExit(f"needs the twin: {reason}")
    server = TwinServer.launch("cost", TwinSpec(num_blocks=600, step_delay_s=0.02), python,
                               work / "model", work)
    try:
        server.wait_ready()
        pid = server.process.pid  # vllm serve's own process is the API server
        reads = (("whole `/metrics`", server.metrics_url, False),
                 ("kvtop's narrowed read", narrowed_url(server.metrics_url, vllm.NAMES), True))
        _batch(server.metrics_url, 20, False)  # warm: imports, first renders
        rows = []
        for name, url, gzip in reads:
            before = proc_cpu_s(pid)
            wall, size = _batch(url, args.requests, gzip)
            spent = proc_cpu_s(pid) - before
            idle_before = proc_cpu_s(pid)
            time.sleep(wall)
            idle = proc_cpu_s(pid) - idle_before
            rows.append((name, size, max(0.0, spent - idle) / args.requests))
    finally:
        server.stop()
    print(f"vLLM 0.33.0 twin (`vllm serve`, idle), {args.requests} requests each, API "
          "server process CPU\n")
    print("| read | bytes sent | API server CPU per scrape | at 1 Hz |")
    print("|---|---:|---:|---:|")
    for name, size, per in rows:
        print(f"| {name} | {size:,} | {per * 1e3:.1f} ms | {per * 100:.2f} % of a core |")


if __name__ == "__main__":
    main()
