"""Leak-detector cost per scrape: what one `LeakDetector.update` costs, on average and at
the bucket closes where its analyses run.

Run: ``python -m benchmarks.bench_leak_detector [--quick]``. Feeds one detector two hours
of scrapes (1 s and 10 s apart) from an engine that never goes idle: 5,000 blocks, load
swinging between ~20 and ~80 % with tokens in flight to match, and a leak from minute 40
(a lump of 2 % of the pool, then 3 % an hour), so that every path runs — the floor trend,
the load-explained level, WATCH and LEAK. Prints the CPU microseconds (this thread's, so
that other processes on a shared machine do not count) per update: mean, 99th percentile,
worst, and the mean of the bucket closes.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import statistics
import sys
import time

from kvtop.derive.leak import LeakDetector
from kvtop.derive.stats import EngineStats

POOL, BLOCK = 5000, 16
LEAK_AT_S, LUMP, LEAK_PER_H = 2400.0, 0.02 * POOL, 0.03 * POOL


def series(interval: float, hours: float, seed: int = 1) -> list[EngineStats]:
    """Scrapes of an engine whose load swings and whose pool leaks from LEAK_AT_S."""
    rng, out = random.Random(seed), []
    prompt = generated = finished_tokens = finished = 0.0
    for i in range(int(hours * 3600 / interval)):
        t = i * interval
        running = max(1.0, 30 + 20 * math.sin(t / 600) + rng.gauss(0, 3))
        in_flight = running * rng.uniform(700, 900)
        leaked = 0.0 if t < LEAK_AT_S else LUMP + LEAK_PER_H * (t - LEAK_AT_S) / 3600
        used = min(POOL, in_flight / BLOCK + running / 2 + leaked)
        done = running / 20 * interval  # requests finished in this scrape's window
        step_tokens = done * 800
        prompt, generated = prompt + step_tokens * 0.7, generated + step_tokens * 0.3
        finished, finished_tokens = finished + done, finished_tokens + step_tokens
        out.append(EngineStats(
            "m", "0", 1.7e9 + t, kv_usage=used / POOL, blocks_total=POOL, blocks_used=used,
            running=running, waiting=0.0, tokens_in_flight=in_flight, prompt_tps=
            step_tokens * 0.7 / interval, generation_tps=step_tokens * 0.3 / interval,
            preemptions_per_s=0.0, finished_per_s={"stop": done / interval},
            window_s=interval if i else None))
    return out


def measure(scrapes: list[EngineStats]) -> tuple[list[float], list[float], str]:
    """Microseconds of each update, those of the bucket closes, and the last state."""
    detector = LeakDetector()
    times, closes = [], []
    bucket = detector.params.bucket_s
    gc.disable()
    try:
        for stats in scrapes:
            start = time.thread_time()
            verdict = detector.update(stats)
            elapsed = (time.thread_time() - start) * 1e6
            times.append(elapsed)
            previous = stats.t - (stats.window_s or 0.0)
            if stats.window_s and math.floor(previous / bucket) != math.floor(stats.t / bucket):
                closes.append(elapsed)
    finally:
        gc.enable()
    return times, closes, verdict.state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 min at 10 s (a second)")
    args = parser.parse_args()
    runs = [(10.0, 0.5)] if args.quick else [(1.0, 2.0), (10.0, 2.0)]
    print(f"Python {sys.version.split()[0]}\n")
    print("| scrape interval | scrapes | mean µs/update | p99 | worst | bucket closes: mean µs "
          "| state at the end |")
    print("|---|---|---|---|---|---|---|")
    for interval, hours in runs:
        times, closes, state = measure(series(interval, hours))
        p99 = statistics.quantiles(times, n=100)[98]
        print(f"| {interval:g} s | {len(times)} | {statistics.fmean(times):.1f} | {p99:.0f} "
              f"| {max(times):.0f} | {statistics.fmean(closes):.0f} | {state} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
