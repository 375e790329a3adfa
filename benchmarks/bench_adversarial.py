"""Parse time of adversarial /metrics bodies: microseconds per KB at growing sizes, to show
it stays flat (linear time) whatever a server sends.

Run: ``python -m benchmarks.bench_adversarial [--reps N]``. Each body is parsed as kvtop
reads a scrape (``parse(text, keep=WANTED)`` and the adapters: ``read_exposition``), every
label set new each time where the body is meant to defeat the caches; prints a markdown
table. Bodies past the parser's limits are refused (the "refused" column), in time linear
in their size too.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from itertools import count

from benchmarks.quick import parse_args, quick_option
from kvtop.collect.adapters import read_exposition
from kvtop.runtime import tune_gc

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
_fresh = count()


def malformed_spread(kb: int) -> str:
    """900 malformed wanted lines spread through unwanted ones: each once made the parser
    rescan the body from its start (quadratic in size × malformed lines)."""
    filler = "process_virtual_memory_bytes 1.2e9\n"
    lines = kb * 1024 // len(filler)
    step = max(lines // 900, 1)
    return "".join(f'{WAITING}{{engine="{i}"}} x\n' if i % step == 0 else filler
                   for i in range(lines))


def long_line(kb: int) -> str:
    """One wanted line with a label value of the whole size (over the line limit: skipped)."""
    return f'{WAITING}{{model_name="{"a" * (kb * 1024)}"}} 1\n'


def long_lines(kb: int) -> str:
    """Wanted lines of 15 KB each (just under the line limit), every label new."""
    tag = next(_fresh)
    value = "v" * 15_000
    return "".join(f'{WAITING}{{n="{tag}-{i}",pad="{value}"}} 1\n' for i in range(kb // 15 + 1))


def many_series(kb: int) -> str:
    """Distinct wanted series, every label set new each parse (no cache helps)."""
    tag = next(_fresh)
    return "".join(f'{RUNNING}{{model_name="m{tag}-{i}",engine="0"}} 1\n'
                   for i in range(kb * 1024 // 56))


def many_pairs(kb: int) -> str:
    """Wanted lines of 40 label pairs each, every line new."""
    tag = next(_fresh)
    pairs = ",".join(f'l{j}="value{j}"' for j in range(40))
    line_len = len(pairs) + 60
    return "".join(f'{WAITING}{{n="{tag}-{i}",{pairs}}} 1\n'
                   for i in range(kb * 1024 // line_len))


def deep_escapes(kb: int) -> str:
    """Label values made of escapes (backslash, quote, newline), every line new."""
    tag = next(_fresh)
    value = '\\\\\\"\\n' * 100
    return "".join(f'{WAITING}{{n="{tag}-{i}",v="{value}"}} 1\n'
                   for i in range(kb * 1024 // (len(value) + 50)))


def junk_lines(kb: int) -> str:
    """Short lines nobody wants (the regex pass skips them in C)."""
    return "x 1\n" * (kb * 1024 // 4)


BODIES: dict[str, Callable[[int], str]] = {
    "malformed lines spread out": malformed_spread,
    "one long line": long_line,
    "15 KB lines": long_lines,
    "many new series": many_series,
    "40 label pairs a line": many_pairs,
    "escapes in every value": deep_escapes,
    "short unwanted lines": junk_lines,
}
SIZES_KB = (64, 256, 1024, 4096)


def measure(make: Callable[[int], str], kb: int, reps: int) -> tuple[float, int, str]:
    """(median ms of read_exposition, lines, what came of it), each rep on a new body."""
    times, outcome, lines = [], "", 0
    for _ in range(reps):
        text = make(kb)
        lines = text.count("\n")
        gc.collect()
        started = time.perf_counter()
        reading = read_exposition(text)
        times.append(time.perf_counter() - started)
        outcome = "refused" if reading.refused else f"{len(reading.engines)} engines"
    return statistics.median(times) * 1e3, lines, outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    quick_option(parser, reps=1)
    args = parse_args(parser)
    tune_gc()  # as every kvtop command runs
    print(f"Python {sys.version.split()[0]}, median of {args.reps} runs, each on a new body\n")
    print("| body | " + " | ".join(f"{kb:,} KB" for kb in SIZES_KB) + " | outcome at 4 MB |")
    print("|---|" + "---:|" * len(SIZES_KB) + "---|")
    for name, make in BODIES.items():
        cells, outcome = [], ""
        for kb in SIZES_KB:
            ms, _, outcome = measure(make, kb, args.reps)
            cells.append(f"{ms * 1e3 / kb:.1f} µs/KB ({ms:.0f} ms)")
        print(f"| {name} | " + " | ".join(cells) + f" | {outcome} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
