"""How large the Prometheus answers kvtop asks for are: what MAX_ANSWER_BYTES is sized from.

Run: ``python -m benchmarks.prometheus_answer_sizes``. Writes the refresh and backfill
answers as Prometheus writes them (``{"metric": {...}, "values": [[t, "v"], ...]}``, labels
sorted, ``job``/``instance``/``namespace``/``pod`` added) for the series a real vLLM 0.33
scrape has of the names kvtop queries; prints bytes per engine and how many engines fit
under the cap (docs/prometheus.md, "Answer sizes").
"""

from __future__ import annotations

import argparse
import sys

import orjson

from benchmarks.paths import METRICS
from benchmarks.quick import parse_args, quick_option
from kvtop.collect.adapters import WANTED
from kvtop.collect.exposition import parse
from kvtop.collect.prometheus import BACKFILL_NAMES, MAX_ANSWER_BYTES

FIXTURE = METRICS / "vllm-0.33.0-v1-twin-under-load.txt"
TARGET_LABELS = {"instance": "10.200.13.117:8000", "job": "vllm", "namespace": "prod",
                 "pod": "vllm-7f9c6b7d5-x2x9q"}


def series(text: str, names: frozenset[str]) -> list[dict[str, str]]:
    out = []
    for sample in parse(text, keep=names).samples:
        labels = dict(sorted({**sample.labels, **TARGET_LABELS}.items()))
        out.append({"__name__": sample.name, **labels})
    return out


def answer_bytes(metrics: list[dict[str, str]], points: int) -> int:
    values = [[1767225600.123 + 15 * i, "123.456"] for i in range(points)]
    result = [{"metric": metric, "values": values} for metric in metrics]
    return len(orjson.dumps({"status": "success",
                             "data": {"resultType": "matrix", "result": result}}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    quick_option(parser)  # it is quick already: a few sizes computed
    parse_args(parser)
    if not FIXTURE.is_file():
        print(f"fixture missing: {FIXTURE}", file=sys.stderr)
        return 2
    text = FIXTURE.read_text(encoding="utf-8")
    refresh, backfill = series(text, WANTED), series(text, BACKFILL_NAMES)
    rows = [
        ("refresh, 1 point per series (15 s scrapes, 5 s refresh)", refresh, 1),
        ("refresh, 5 points (1 s scrapes)", refresh, 5),
        ("backfill, 30 min at a 15 s step (the default)", backfill, 121),
        ("backfill, 60 min at 15 s", backfill, 241),
        ("backfill, 30 min at 5 s", backfill, 361),
    ]
    print(f"cap: {MAX_ANSWER_BYTES:,} bytes\n")
    print("| query | series per engine | per engine | 500 engines | at the cap |")
    print("|---|---:|---:|---:|---:|")
    for name, metrics, points in rows:
        size = answer_bytes(metrics, points)
        print(f"| {name} | {len(metrics)} | {size / 1e3:.0f} KB | {size * 500 / 1e6:.0f} MB "
              f"| ~{MAX_ANSWER_BYTES // size:,} engines |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
