"""What the rehearsal's load driver costs: CPU per request, and the rate one core sustains.

Run: ``python -m benchmarks.bench_rehearse [--rates 50,100,200,400] [--seconds 10]``.
Starts ``kvtop sim --workload none`` (speed 1, 8000 blocks, 256 sequences) in its own
process, then drives it from this process, open loop, at each rate in turn: short requests
(64-token prompt, 16 tokens out) streamed with usage on every chunk, each attempt logged to
a JSON Lines file and folded into the judge's table, exactly as ``kvtop rehearse`` does
(the judge itself runs once at the end and is left out). Per rate: requests answered, this
process's CPU per request (user and system: the kernel's loopback TCP work is charged to
the sender, and grows on a busy machine), its share of a core, how late the sends were
against the plan (p50/p99; an open loop that can't keep up falls behind), and the
simulator's CPU for scale.
Prints a markdown table and the rate one core would sustain (1 / CPU per request).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from benchmarks.bench_fleet import proc_cpu_s
from benchmarks.quick import parse_args, quick_option
from kvtop.derive.samples import percentile
from kvtop.load.driver import DriverSettings, LoadDriver, RequestRecord, RunClock
from kvtop.load.openai_client import list_models, make_session
from kvtop.load.workloads import Planned, Workload
from kvtop.rehearse.requests import RequestTable


def short_requests() -> Iterator[Planned]:
    while True:
        yield Planned("short", 64, 16)


async def drive(base: str, rate: float, seconds: float, log: Path) -> dict[str, float]:
    table = RequestTable()
    lates: list[float] = []
    with log.open("wb") as out:
        def on_record(record: RequestRecord) -> None:
            table.add(record)
            out.write(orjson.dumps(record.to_json()) + b"\n")
            out.flush()
            if record.queued_s is not None:
                lates.append(record.queued_s)

        async with make_session(limit=512) as session:
            (model,) = await list_models(session, base + "/v1")
            settings = DriverSettings(base + "/v1", model.id, rate=rate, concurrency=512)
            driver = LoadDriver(settings, Workload("bench", short_requests()), session,
                                RunClock(), on_record)
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(seconds, stop.set)
            usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            await driver.run(stop)
            await driver.finish(10.0)
            usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall0
    answered = max(table.statuses["ok"], 1)
    user, system = usage.ru_utime - usage0.ru_utime, usage.ru_stime - usage0.ru_stime
    return {"rate": rate, "answered": table.statuses["ok"],
            "other": len(table) - table.statuses["ok"],
            "cpu_ms": 1000 * (user + system) / answered, "user_ms": 1000 * user / answered,
            "sys_ms": 1000 * system / answered, "core": (user + system) / wall,
            "late_p50_ms": 1000 * (percentile(lates, 0.5) or 0),
            "late_p99_ms": 1000 * (percentile(lates, 0.99) or 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="50,100,200,400")
    parser.add_argument("--seconds", type=float, default=10.0)
    quick_option(parser, rates="20", seconds=1.0)
    args = parse_args(parser)
    kvtop = Path(sys.executable).parent / "kvtop"
    sim = subprocess.Popen([str(kvtop), "sim", "--port", "0", "--workload", "none",
                            "--blocks", "8000", "--max-num-seqs", "256"],
                           stdout=subprocess.PIPE, text=True)
    try:
        base = (sim.stdout.readline() if sim.stdout else "").strip().removesuffix("/metrics")
        rows = []
        with tempfile.TemporaryDirectory() as work:
            for rate in (float(r) for r in args.rates.split(",")):
                sim_cpu0 = proc_cpu_s(sim.pid)
                row = asyncio.run(drive(base, rate, args.seconds, Path(work) / "log.jsonl"))
                row["sim_core"] = (proc_cpu_s(sim.pid) - sim_cpu0) / args.seconds
                rows.append(row)
    finally:
        sim.terminate()
        sim.wait(20)
    print("| rate (req/s) | answered | not answered | driver CPU per request (user + sys) "
          "| driver core | sends late p50 / p99 | simulator core |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['rate']:.0f} | {r['answered']:.0f} | {r['other']:.0f} | "
              f"{r['cpu_ms']:.2f} ms ({r['user_ms']:.2f} + {r['sys_ms']:.2f}) | "
              f"{r['core']:.2f} | {r['late_p50_ms']:.1f} / {r['late_p99_ms']:.1f} ms | "
              f"{r['sim_core']:.2f} |")
    best = min(r["cpu_ms"] for r in rows)
    print(f"\none core sustains about {1000 / best:.0f} requests/s "
          f"(1 / {best:.2f} ms, the lowest CPU per request measured)")


if __name__ == "__main__":
    main()
