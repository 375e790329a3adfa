"""``kvtop record``: every scrape of the targets into a recording (docs/recording-format.md),
and the KV event batches of those that name an endpoint (``--kv-events``, ``kv_events``).

A write that fails (a full disk) is told on stderr once when it starts failing and once when
it works again, and polling goes on; the file always holds whole lines. The recording stops
at ``--max-size``; the exit code says whether every scrape is in the file.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from kvtop.cli_args import (
    MAX_SIZE_HELP,
    add_kv_events_argument,
    add_target_arguments,
    parse_duration,
    positive_seconds,
    resolve_kv_events,
    resolve_targets,
    size,
)
from kvtop.collect.kv_endpoint import TargetKvEvents
from kvtop.collect.live import DirectSource
from kvtop.collect.target import Scrape
from kvtop.collect.watch import watch
from kvtop.config import load_config
from kvtop.exits import EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE
from kvtop.safe_text import warn
from kvtop.store.recording import (
    DEFAULT_MAX_BYTES,
    RecordingExists,
    RecordingWriter,
    size_text,
)


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "record", help=summary,
        description="Poll the targets and write every scrape (body or error) to a new "
                    "recording (docs/recording-format.md) until --duration passes or Ctrl-C.")
    add_target_arguments(parser)
    add_kv_events_argument(parser)
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE",
                        help="the recording to write (JSON Lines; gzip when FILE ends in .gz)")
    parser.add_argument("--interval", type=positive_seconds, default=1.0, metavar="S",
                        help="seconds between scrapes of a target (default 1)")
    parser.add_argument("--duration", type=parse_duration, metavar="D",
                        help="stop after D (90s, 30m, 2h); default: until Ctrl-C")
    parser.add_argument("--max-size", type=size, default=DEFAULT_MAX_BYTES, metavar="SIZE",
                        help=MAX_SIZE_HELP + "; exit 4 when reached")
    parser.add_argument("--force", action="store_true",
                        help="replace FILE if it exists (never written through a symlink)")
    return parser


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    targets = resolve_targets(args, config)
    source = DirectSource(targets, interval_s=args.interval, timeout_s=args.timeout,
                          insecure=args.insecure, narrow=not args.full_metrics,
                          kv_events=resolve_kv_events(args, config, targets))
    return record_to(source, args.output, duration_s=args.duration, max_bytes=args.max_size,
                     replace=args.force)


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


async def record(source: DirectSource, writer: RecordingWriter, *,
                 duration_s: float | None) -> int:
    """Poll until ``duration_s`` passes, SIGINT/SIGTERM, or the file is full; returns the
    scrapes written."""
    reporter = _Reporter(writer)

    def on_scrape(scrape: Scrape) -> None:
        writer.write(scrape)
        writer.flush()  # a crash or kill loses at most the scrape in flight
        reporter.after_write()

    def on_kv_events(item: TargetKvEvents) -> None:
        writer.write_kv_events(item.batch, item.target)  # flushed with the next scrape
        reporter.after_write()

    await watch(source.live(), on_scrape, duration_s=duration_s, until=lambda: writer.full,
                kv_events=source.kv_live(), on_kv_events=on_kv_events)
    return writer.written


def record_to(source: DirectSource, output: Path, *, duration_s: float | None,
              max_bytes: int | None = DEFAULT_MAX_BYTES, replace: bool = False) -> int:
    """Record ``source`` into a new file at ``output``; the exit code."""
    try:
        writer = RecordingWriter(output, interval_s=source.interval_s, targets=source.targets,
                                 max_bytes=max_bytes, replace=replace)
    except OSError as exc:
        hint = " (--force replaces it)" if isinstance(exc, RecordingExists) else ""
        _say(f"cannot write {output}: {exc.strerror or exc}{hint}")
        return EXIT_USAGE
    with writer:
        limit = f", at most {size_text(max_bytes)}" if max_bytes else ""
        _say(f"{len(source.targets)} target(s) every {source.interval_s:g} s -> {output}{limit}")
        asyncio.run(record(source, writer, duration_s=duration_s))
    return _summary(writer)


def _summary(writer: RecordingWriter) -> int:
    if writer.kv_written:
        _say(f"{writer.written - writer.kv_written} scrapes and {writer.kv_written} KV event "
             f"batches written to {writer.path}")
    else:
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
