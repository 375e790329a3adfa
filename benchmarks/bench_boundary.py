"""What the output boundary and the input masks cost: per frame and per scrape.

The boundary (``kvtop/safe_text.py``) is paid in three places, each timed here as a whole
(the boundary's calls and the work around them), best of several rounds of many repeats, so
a change to the boundary shows as a change of these numbers:

* **frame**: the fleet rows of 500 engines after one poll (``build_rows``: names, models,
  engines and errors made safe), grouped by model, as the app builds them before it draws;
* **table**: ``kvtop snapshot --table`` of the same 500 engines (every cell made safe and
  padded to its column in terminal cells);
* **scrape**: one 48.6 KB vLLM body as the poller keeps it: masked (the token and any
  echoed ``Authorization``), decoded, parsed and adapted;
* **prometheus refresh**: one refresh answer of 100 engines as the Prometheus source keeps
  it: masked, decoded, checked and grouped per instance;
* **display_text**: 10,000 calls on the strings a frame shows (names, models, errors).

    .venv/bin/python -m benchmarks.bench_boundary [--rounds 7]

Numbers for issue #27 (before and after the boundary was made structural) are in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable

import orjson

from benchmarks.bench_fleet_frame import build_trackers, new_values
from benchmarks.paths import METRICS
from benchmarks.quick import parse_args, quick_option
from kvtop.collect import http
from kvtop.collect.adapters import WANTED, read_exposition
from kvtop.collect.exposition import parse
from kvtop.collect.prometheus import group_scrapes
from kvtop.safe_text import Secret, display_text, mask_bytes
from kvtop.view.fleet import build_rows
from kvtop.view.groups import group_rows
from kvtop.view.table import table_lines

BODY = METRICS / "vllm-0.33.0-v1-twin-under-load.txt"
TOKEN = Secret("tok-0123456789abcdef-bench")
T0 = 1_767_225_600.0


def best_ms(action: Callable[[], object], repeats: int, rounds: int) -> float:
    """The best round's mean CPU milliseconds per call (CPU time: waits for a core on a
    loaded machine do not count; the best round is the least disturbed)."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        started = time.process_time()
        for _ in range(repeats):
            action()
        best = min(best, (time.process_time() - started) / repeats)
    return best * 1000


def _scrape_once(raw: bytes) -> None:
    data = mask_bytes(bytearray(raw), TOKEN)
    text = http._decode_text(data, "text/plain")
    read_exposition(text, None)


def _prometheus_answer(engines: int) -> bytes:
    text = BODY.read_text(encoding="utf-8")
    result = []
    for i in range(engines):
        for sample in parse(text, keep=WANTED).samples:
            metric = {"__name__": sample.name, **sample.labels, "job": "vllm",
                      "instance": f"10.0.{i // 200}.{i % 200}:8000", "namespace": "prod"}
            result.append({"metric": metric, "values": [[T0, repr(sample.value)]]})
    return orjson.dumps({"status": "success", "data": {"resultType": "matrix",
                                                       "result": result}})


def _refresh_once(raw: bytes) -> None:
    data = mask_bytes(bytearray(raw), TOKEN)
    group_scrapes(orjson.loads(data)["data"]["result"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    quick_option(parser, rounds=1)
    args = parse_args(parser)
    trackers = build_trackers(500)
    new_values(trackers, random.Random(1), T0 + 2)
    states = [t.state for t in trackers.values()]
    rows = build_rows(states, T0 + 2)
    strings = [s for row in rows for s in (row.name, row.cells["model"].text,
                                           row.cells["status"].text)]
    strings = (strings * (10_000 // len(strings) + 1))[:10_000]
    raw = BODY.read_bytes()
    answer = _prometheus_answer(100)

    def frame() -> None:
        group_rows(build_rows(states, T0 + 2), "model", set(), "name")

    results = {
        "frame (500 engines: rows, grouped)": best_ms(frame, 10, args.rounds),
        "table (snapshot --table, 500 engines)": best_ms(
            lambda: table_lines(states, T0 + 2), 5, args.rounds),
        "scrape (48.6 KB body: mask, decode, read)": best_ms(
            lambda: _scrape_once(raw), 50, args.rounds),
        f"prometheus refresh (100 engines, {len(answer) / 1e6:.1f} MB)": best_ms(
            lambda: _refresh_once(answer), 5, args.rounds),
        "display_text x 10,000": best_ms(
            lambda: [display_text(s) for s in strings], 10, args.rounds),
    }
    print("| what | ms |")
    print("|---|---:|")
    for name, ms in results.items():
        print(f"| {name} | {ms:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
