"""``kvtop record``: every scrape of the targets into a recording (docs/recording-format.md).

A write that fails (a full disk) is told on stderr once when it starts failing and once when
it works again, and polling goes on; the file always holds whole lines. The recording stops
at ``--max-size``. Exit 0 when every scrape is in the file, 4 when it falls short.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from kvtop.collect.clock import stop_event
from kvtop.collect.poller import Poller
from kvtop.collect.target import Scrape, Target
from kvtop.safe_text import warn
from kvtop.store.recording import (
    DEFAULT_MAX_BYTES,
    RecordingExists,
    RecordingWriter,
    size_text,
)

EXIT_OK, EXIT_USAGE, EXIT_INCOMPLETE = 0, 2, 4


def _say(text: str) -> None:
    warn(f"kvtop record: {text}")


class _Reporter:
    """Tells stderr when writing starts failing and when it works again (not per scrape)."""

    def __init__(self, writer: RecordingWriter) -> None:
        self.writer = writer
        self._failing = False
        self._full = False

    def after_write(self) -> None:
        writer = self.writer
        if writer.failing and not self._failing:
            _say(f"cannot write {writer.path}: {writer.error}; scrapes are lost until it "
                 "can (still polling, trying again every scrape)")
        elif self._failing and not writer.failing:
            _say(f"writing {writer.path} again ({writer.lost} scrapes lost)")
        if writer.full and not self._full:
            _say(f"{writer.path} reached --max-size ({size_text(writer.max_bytes or 0)}); "
                 "recording stopped")
        self._failing, self._full = writer.failing, writer.full


async def record(targets: list[Target], writer: RecordingWriter, *, interval_s: float,
                 duration_s: float | None, timeout_s: float | None, insecure: bool,
                 full_metrics: bool = False) -> int:
    """Poll until ``duration_s`` passes, SIGINT/SIGTERM, or the file is full; returns the
    scrapes written."""
    stop = stop_event(duration_s)
    reporter = _Reporter(writer)

    def on_scrape(scrape: Scrape) -> None:
        writer.write(scrape)
        writer.flush()  # a crash or kill loses at most the scrape in flight
        reporter.after_write()
        if writer.full:
            stop.set()

    async with Poller(targets, interval_s=interval_s, timeout_s=timeout_s,
                      insecure=insecure, narrow=not full_metrics) as poller:
        await poller.run(on_scrape, stop=stop)
    return writer.written


def run_record(targets: list[Target], output: Path, *, interval_s: float,
               duration_s: float | None, timeout_s: float | None, insecure: bool,
               full_metrics: bool = False, max_bytes: int | None = DEFAULT_MAX_BYTES,
               replace: bool = False) -> int:
    try:
        writer = RecordingWriter(output, interval_s=interval_s, targets=targets,
                                 max_bytes=max_bytes, replace=replace)
    except OSError as exc:
        hint = " (--force replaces it)" if isinstance(exc, RecordingExists) else ""
        _say(f"cannot write {output}: {exc.strerror or exc}{hint}")
        return EXIT_USAGE
    with writer:
        limit = f", at most {size_text(max_bytes)}" if max_bytes else ""
        _say(f"{len(targets)} target(s) every {interval_s:g} s -> {output}{limit}")
        asyncio.run(record(targets, writer, interval_s=interval_s, duration_s=duration_s,
                           timeout_s=timeout_s, insecure=insecure, full_metrics=full_metrics))
    return _summary(writer)


def _summary(writer: RecordingWriter) -> int:
    _say(f"{writer.written} scrapes written to {writer.path}")
    if writer.lost:
        _say(f"{writer.lost} scrapes were not written ({writer.error}); the file holds "
             "every other one")
    if writer.end_lost:
        _say(f"the end of {writer.path} could not be written ({writer.error}): readers "
             "warn that it ends early, and read every scrape in it")
    if writer.full:
        _say(f"stopped early at --max-size {size_text(writer.max_bytes or 0)}")
    return EXIT_INCOMPLETE if writer.lost or writer.end_lost or writer.full else EXIT_OK
