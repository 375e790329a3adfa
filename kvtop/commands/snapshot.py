"""``kvtop snapshot``: read the targets (twice, so rates are filled in), or what a Prometheus
stored lately, and print JSON or a table; with ``--watch``, keep reading and print one
document per interval, one per line (NDJSON), until Ctrl-C or the reader goes away."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from kvtop.cli_args import (
    add_output_arguments,
    add_prometheus_arguments,
    add_target_arguments,
    open_source,
    positive_seconds,
)
from kvtop.collect.clock import stop_event
from kvtop.collect.source import Source, SourceError, opened
from kvtop.collect.target import Scrape
from kvtop.collect.watch import watch
from kvtop.config import ConfigError, load_config
from kvtop.exits import EXIT_INTERRUPTED, EXIT_OK, EXIT_UNREADABLE
from kvtop.safe_text import json_text, warn

if TYPE_CHECKING:
    from kvtop.derive.tracker import TargetState, TargetTracker

FIRST_READ_MAX_S = 5.0  # the poller's longest default deadline: every target was tried by then


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "snapshot", help=summary,
        description="Read every target (two scrapes --interval apart, so rates are filled "
                    "in) and print the snapshot JSON (docs/snapshot-json.md) or a table with "
                    "the app's columns.")
    add_target_arguments(parser)
    parser.add_argument("--interval", type=positive_seconds, default=1.0, metavar="S",
                        help="seconds between the samples (default 1)")
    parser.add_argument("--samples", type=int, choices=(1, 2), default=2,
                        help="1 for a single scrape (no rates), 2 (default) for rates")
    add_output_arguments(parser, ("--table", "--text"),
                         "a table with the app's columns, one line per engine, never wrapped "
                         "(the default on a terminal)")
    parser.add_argument("--no-gpu", action="store_true", help="leave local GPUs out")
    parser.add_argument("--watch", nargs="?", const=True, type=positive_seconds, metavar="S",
                        help="keep reading and print one snapshot JSON document per line "
                             "every S seconds (default --interval) until Ctrl-C (exit 130): "
                             "NDJSON for jq and log shippers")
    add_prometheus_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    every_s = _watch_seconds(args)
    config = load_config(args.config)
    with open_source(args, config, interval_s=every_s or args.interval) as source:
        if every_s is not None:
            return stream(source, every_s=every_s, with_gpus=not args.no_gpu)
        return snapshot(source, samples=args.samples, as_json=args.as_json,
                        with_gpus=not args.no_gpu)


def _watch_seconds(args: argparse.Namespace) -> float | None:
    if args.watch is None:
        return None
    if args.as_json is False:
        raise ConfigError("--watch prints JSON lines; --table is for one snapshot")
    return args.interval if args.watch is True else float(args.watch)


def snapshot(source: Source, *, samples: int, as_json: bool | None,
             with_gpus: bool) -> int:
    """Read ``source``, print the snapshot; the exit code."""
    try:
        states = asyncio.run(read_states(source, samples=samples))
    except SourceError as exc:
        warn(f"kvtop snapshot: {exc}")  # it may quote what Prometheus said
        return EXIT_UNREADABLE
    return print_snapshot(states, as_json=as_json, with_gpus=with_gpus)


async def read_states(source: Source, *,
                      samples: int) -> list[TargetState]:
    """The latest ``samples`` scrapes of every target, each folded through its tracker."""
    from kvtop.derive.tracker import TargetTracker

    async with opened(source):
        targets = await source.discover()
        scrapes = await source.latest(samples)
    trackers = {target.url: TargetTracker(target) for target in targets}
    for scrape in scrapes:
        tracker = trackers.setdefault(scrape.target.url, TargetTracker(scrape.target))
        tracker.update(scrape)
    return [tracker.state for tracker in trackers.values()]


def snapshot_exit_code(states: list[TargetState]) -> int:
    return EXIT_OK if all(state.status == "up" for state in states) else EXIT_UNREADABLE


def document_of(states: list[TargetState], *, with_gpus: bool) -> dict[str, Any]:
    """The snapshot document (docs/snapshot-json.md) of these states, taken now."""
    from kvtop.report.gpus import gpu_report
    from kvtop.report.snapshot import snapshot_document

    gpus, sources = gpu_report(states, with_nvml=with_gpus)
    return snapshot_document(states, gpus, taken_at=datetime.now(timezone.utc),
                             gpu_sources=sources)


def print_snapshot(states: list[TargetState], *, as_json: bool | None, with_gpus: bool) -> int:
    """Print the snapshot of these states (JSON or a table); the exit code."""
    from kvtop.report.output import emit
    from kvtop.view.table import note_lines, table_text

    document = document_of(states, with_gpus=with_gpus)
    as_json = not sys.stdout.isatty() if as_json is None else as_json
    emit(document, as_json, lambda doc: table_text(states, doc))
    if not as_json:  # the JSON says it all; a table's notes go to stderr, rows alone to a pipe
        for note in note_lines(states, document):
            warn(f"kvtop: {note}")
    return snapshot_exit_code(states)


# -- --watch: a document per interval -------------------------------------------------------


def stream(source: Source, *, every_s: float, with_gpus: bool) -> int:
    """Print a snapshot document of ``source`` every ``every_s`` seconds, one per line, each
    flushed, until Ctrl-C or SIGTERM (exit 130); a reader that goes away ends it as it ends
    every command (BrokenPipeError: exit 141, quietly)."""
    try:
        asyncio.run(_stream(source, every_s=every_s, with_gpus=with_gpus))
    except SourceError as exc:
        warn(f"kvtop snapshot: {exc}")
        return EXIT_UNREADABLE
    return EXIT_INTERRUPTED


async def _stream(source: Source, *, every_s: float, with_gpus: bool) -> None:
    from kvtop.derive.tracker import TargetTracker

    stop = stop_event()
    async with opened(source):
        trackers = {target.url: TargetTracker(target) for target in await source.discover()}
        live = source.live()
        if live is None:
            return
        tried = asyncio.Event()  # every target tried once: no document says "pending"

        def fold(scrape: Scrape) -> None:
            trackers.setdefault(scrape.target.url, TargetTracker(scrape.target)).update(scrape)
            if all(tracker.state.status != "pending" for tracker in trackers.values()):
                tried.set()

        watching = asyncio.create_task(watch(live, fold, stop=stop))
        try:
            await _print_every(every_s, trackers, tried, stop, with_gpus=with_gpus)
        finally:
            stop.set()
            await watching


async def _print_every(every_s: float, trackers: dict[str, TargetTracker], tried: asyncio.Event,
                       stop: asyncio.Event, *, with_gpus: bool) -> None:
    """A document every ``every_s`` from the start (the first once every target was tried,
    within the poller's longest deadline), on the interval's beat, until ``stop``."""
    loop = asyncio.get_running_loop()
    due = loop.time() + every_s
    await _until(stop, tried, FIRST_READ_MAX_S + every_s)
    while not stop.is_set():
        await _until(stop, asyncio.Event(), due - loop.time())
        if stop.is_set():
            return
        states = [tracker.state for tracker in trackers.values()]
        sys.stdout.write(json_text(document_of(states, with_gpus=with_gpus),
                                   separators=(",", ":")) + "\n")
        sys.stdout.flush()  # a line a pipe's reader gets now, not when a buffer fills
        due = max(due + every_s, loop.time())  # late (a slow GPU read): skip, never burst


async def _until(stop: asyncio.Event, other: asyncio.Event, seconds: float) -> None:
    """Wait until ``stop`` or ``other`` is set, or ``seconds`` pass."""
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(other.wait())]
    await asyncio.wait(waits, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
    for waiting in waits:
        waiting.cancel()
