"""``kvtop snapshot``: read the targets (twice, so rates are filled in), or what a Prometheus
stored lately, and print JSON or a table."""

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
from kvtop.collect.source import Source, SourceError, opened
from kvtop.config import load_config
from kvtop.exits import EXIT_OK, EXIT_UNREADABLE
from kvtop.safe_text import warn

if TYPE_CHECKING:
    from kvtop.derive.tracker import TargetState


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
    add_prometheus_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    with open_source(args, load_config(args.config), interval_s=args.interval) as source:
        return snapshot(source, samples=args.samples, as_json=args.as_json,
                        with_gpus=not args.no_gpu)


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


def print_snapshot(states: list[TargetState], *, as_json: bool | None, with_gpus: bool) -> int:
    """Print the snapshot of these states (JSON or a table); the exit code."""
    from kvtop.report.gpus import gpu_report
    from kvtop.report.output import emit
    from kvtop.report.snapshot import snapshot_document
    from kvtop.view.table import note_lines, table_text

    gpus, sources = gpu_report(states, with_nvml=with_gpus)
    document: dict[str, Any] = snapshot_document(
        states, gpus, taken_at=datetime.now(timezone.utc), gpu_sources=sources)
    as_json = not sys.stdout.isatty() if as_json is None else as_json
    emit(document, as_json, lambda doc: table_text(states, doc))
    if not as_json:  # the JSON says it all; a table's notes go to stderr, rows alone to a pipe
        for note in note_lines(states, document):
            warn(f"kvtop: {note}")
    return snapshot_exit_code(states)
