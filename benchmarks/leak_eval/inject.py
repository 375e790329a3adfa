"""Lumps injected into healthy recordings: how soon kvtop sees them, where they land.

Run after ``run.py`` (same ``--out``): ``python -m benchmarks.leak_eval.inject [--out DIR]
[--only a,b]``; ``--quick`` needs no run before it: it makes the one recording it uses
(healthy-ramp, if not in DIR) and injects at two start minutes.

For each healthy continuous recording, and each start minute in 12, 16, ... 28, it adds
a lump to the usage gauge of every scrape from that minute on (two lumps of 3 % 30 min
apart, or one of 5 %), replays the result through ``kvtop check``'s code and prints
the delays to WATCH and LEAK after the first lump. A probe of sensitivity, not of realism:
the added blocks take no room from the working set, and they survive restarts.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from benchmarks.leak_eval.run import SCENARIOS, run_one
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape
from kvtop.derive.worst import CheckRun
from kvtop.store.recording import read_recording

USAGE = re.compile(r"^(vllm:kv_cache_usage_perc\{[^}]*\}) (\S+)$", re.M)
STARTS_MIN = (12, 16, 20, 24, 28)
QUICK = ("healthy-ramp", (12, 20))  # a healthy continuous recording, quick to make
SHAPES = (((0, 0.03), (30, 0.03)), ((0, 0.05),))  # (minutes after the first, pool fraction)


def with_lump(body: str, extra: float) -> str:
    """The exposition with `extra` (a fraction of the pool) added to the usage gauge."""
    def add(match: re.Match[str]) -> str:
        return f"{match.group(1)} {min(1.0, float(match.group(2)) + extra)!r}"
    return USAGE.sub(add, body)


def delays(path: Path, lumps: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """Minutes from the first lump to the first WATCH-or-LEAK and to the first LEAK."""
    scrapes = sorted(read_recording(path).scrapes, key=lambda s: s.t)
    t0, first = scrapes[0].t, min(at for at, _ in lumps)
    run, watch, leak = CheckRun(), None, None
    for scrape in scrapes:
        extra = sum(frac for at, frac in lumps if scrape.t >= t0 + at * 60)  # of the pool
        body = with_lump(scrape.body or "", extra) if extra else scrape.body
        run.feed(read_scrape(Scrape(scrape.target, scrape.t, body=body, version=scrape.version)))
        state = run.trackers[scrape.target.url].state.engines[0].leak
        after = (scrape.t - t0) / 60 - first
        if after >= 0 and state is not None:
            if watch is None and state.state in ("watch", "leak"):
                watch = after
            if leak is None and state.state == "leak":
                leak = after
    return watch, leak


def cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "kvtop-leak-eval")
    ap.add_argument("--only", help="comma-separated healthy scenario names")
    ap.add_argument("--quick", action="store_true",
                    help=f"make {QUICK[0]} if missing, inject at {QUICK[1]} min (~20 s)")
    args = ap.parse_args()
    names = [sc.name for sc in SCENARIOS if sc.leak_fill_h is None and not sc.lumps
             and sc.load == "continuous" and sc.source != "twin"
             and (not args.only or sc.name in args.only.split(","))]
    starts = STARTS_MIN
    if args.quick:
        names, starts = [QUICK[0]], QUICK[1]
        args.out.mkdir(parents=True, exist_ok=True)
        run_one(next(sc for sc in SCENARIOS if sc.name == QUICK[0]), args.out, reuse=True)
    header = [f"{'+'.join(f'{f:.0%}' for _, f in shape)} at {start}"
              for start in starts for shape in SHAPES]
    print("| recording | " + " | ".join(header) + " |")
    print("|---|" + "---|" * len(header))
    for name in names:
        path = args.out / f"{name}.jsonl.gz"
        if not path.exists():
            print(f"{name}: no recording in {args.out} (run run.py first)", file=sys.stderr)
            continue
        cells = []
        for start in starts:
            for shape in SHAPES:
                watch, leak = delays(path, [(start + at, frac) for at, frac in shape])
                cells.append(f"{cell(watch)} / {cell(leak)}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
