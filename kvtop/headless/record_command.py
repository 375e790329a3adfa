"""``kvtop record``: every scrape of the targets into a recording (docs/recording-format.md)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from kvtop.collect.poller import Poller
from kvtop.collect.target import Scrape, Target
from kvtop.headless.lifetime import stop_event
from kvtop.store.recording import RecordingWriter

EXIT_OK, EXIT_USAGE = 0, 2


async def record(targets: list[Target], writer: RecordingWriter, *, interval_s: float,
                 duration_s: float | None, timeout_s: float | None, insecure: bool,
                 full_metrics: bool = False) -> int:
    """Poll until ``duration_s`` passes or SIGINT/SIGTERM; returns the scrapes written."""
    stop = stop_event(duration_s)
    written = 0

    def on_scrape(scrape: Scrape) -> None:
        nonlocal written
        writer.write(scrape)
        writer.flush()  # a crash or kill loses at most the scrape in flight
        written += 1

    async with Poller(targets, interval_s=interval_s, timeout_s=timeout_s,
                      insecure=insecure, narrow=not full_metrics) as poller:
        await poller.run(on_scrape, stop=stop)
    return written


def run_record(targets: list[Target], output: Path, *, interval_s: float,
               duration_s: float | None, timeout_s: float | None, insecure: bool,
               full_metrics: bool = False) -> int:
    try:
        writer = RecordingWriter(output, interval_s=interval_s, targets=targets)
    except OSError as exc:
        print(f"kvtop record: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    with writer:
        print(f"kvtop record: {len(targets)} target(s) every {interval_s:g} s -> {output}",
              file=sys.stderr)
        written = asyncio.run(record(targets, writer, interval_s=interval_s,
                                     duration_s=duration_s, timeout_s=timeout_s,
                                     insecure=insecure, full_metrics=full_metrics))
    print(f"kvtop record: {written} scrapes written to {output}", file=sys.stderr)
    return EXIT_OK
