"""Parser benchmark: kvtop's parse+adapt vs prometheus_client on real vLLM scrapes.

Run: ``python -m benchmarks.bench_parser [--reps N]``. Same bytes, one process; prints a
markdown table of min and median milliseconds per scrape and the speed-up over
``prometheus_client.parser.text_string_to_metric_families`` (fully consumed).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.paths import METRICS as FIXTURES
from benchmarks.quick import parse_args, quick_option
from kvtop.collect.adapters import read_exposition
from kvtop.collect.exposition import parse

SCRAPES = ("vllm-0.29.0-v1-inferstack-t4-capture.txt", "vllm-0.33.0-v1-twin-under-load.txt")


def prometheus_client_parse(text: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def time_ms(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """(min, median) milliseconds of ``reps`` calls, after a warm-up (fills kvtop's caches,
    as on every scrape after a monitor's first)."""
    for _ in range(3):
        fn()
    times = []
    gc.disable()  # a collection landing in one run says nothing about the parser
    try:
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return min(times) * 1e3, statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=300)
    quick_option(parser, reps=5)
    args = parse_args(parser)
    missing = [name for name in SCRAPES if not (FIXTURES / name).is_file()]
    if missing:
        print(f"fixtures missing under {FIXTURES}: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(f"Python {sys.version.split()[0]}, {args.reps} repetitions per row\n")
    print("| scrape | KB | prometheus_client min / median ms | kvtop parse+adapt min / median ms "
          "| speed-up (min / median) | kvtop full parse min / median ms |")
    print("|---|---|---|---|---|---|")
    for name in SCRAPES:
        text = (FIXTURES / name).read_text(encoding="utf-8")
        ref = time_ms(lambda text=text: prometheus_client_parse(text), max(args.reps // 5, 20))
        ours = time_ms(lambda text=text: read_exposition(text), args.reps)
        full = time_ms(lambda text=text: parse(text), args.reps)
        print(f"| {name} | {len(text.encode()) / 1000:.1f} | {ref[0]:.2f} / {ref[1]:.2f} "
              f"| {ours[0]:.3f} / {ours[1]:.3f} | {ref[0] / ours[0]:.1f}× / "
              f"{ref[1] / ours[1]:.1f}× | {full[0]:.3f} / {full[1]:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
