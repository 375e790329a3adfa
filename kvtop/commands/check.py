"""``kvtop check``: the leak detector's verdict, headless, on live targets, a recording or
what Prometheus stored.

Every source goes one way: the scrapes it has stored already (a recording, Prometheus's
history), then, for what is left of ``--duration``, the live ones, through the same
:class:`TargetTracker` (and so the same detector) as the app. JSON contract:
docs/check-json.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kvtop.cli_args import (
    MAX_SIZE_HELP,
    add_kv_events_argument,
    add_output_arguments,
    add_prometheus_arguments,
    add_target_arguments,
    add_time_range_arguments,
    open_source,
    parse_duration,
    positive_seconds,
    size,
    time_range,
)
from kvtop.collect.clock import stop_event
from kvtop.collect.kv_endpoint import TargetKvEvents
from kvtop.collect.source import KvEventSource, ScrapeSource, Source, SourceError, opened
from kvtop.collect.target import Scrape
from kvtop.collect.watch import watch
from kvtop.config import ConfigError, leak_params, load_config
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.limits import LimitParams
from kvtop.derive.worst import CheckRun, describe_size
from kvtop.exits import EXIT_NO_DATA, EXIT_USAGE
from kvtop.report.output import emit
from kvtop.safe_text import display_text, erase_line, rewrite_line, warn
from kvtop.store.recording import DEFAULT_MAX_BYTES, RecordingError, RecordingWriter
from kvtop.store.time_range import TimeRange

EVERYTHING = TimeRange()  # no --since/--until: every scrape the source has

DEFAULT_DURATION_S = 1800.0
PROGRESS_PERIOD_S = 1.0


def _render_text(document: dict[str, Any]) -> str:
    span = ""
    if document["started_at"] is not None:
        span = (f" ({_clock(document['duration_s'])} judged, {document['started_at']} to "
                f"{document['ended_at']})")
    stall = document["stall"]
    stall_text = f", {stall.upper()}" if stall in ("stalled", "saturated") else ""
    interrupted = " (interrupted: the verdict so far)" if document.get("interrupted") else ""
    lines = [f"kvtop check: {document['verdict'].upper()}{stall_text}{span}{interrupted}"]
    engines = [(t, e) for t in document["targets"] for e in t["engines"]]
    if document.get("needs") and not engines:
        lines.append(f"  no verdict: {display_text(document['needs'])}")
    for target, engine in engines:
        name = display_text(
            f"{target['target']} {engine['model'] or ''} {engine['engine'] or ''}".strip())
        needs = f"; {engine['needs']}" if engine.get("needs") else ""
        lines.append(f"  {engine['verdict'].upper():7} {name}: "
                     f"{display_text(engine['reason'] + needs)}")
        if engine["verdict"] == "leak":
            size = {"blocks": engine["leaked_blocks"], "tokens": engine["leaked_tokens"],
                    "gib": engine["leaked_gib"]}
            lines.append(f"          leaked {describe_size(size)}; next: "
                         f"{engine['next_step']}")
        if engine["stall"]["verdict"] in ("stalled", "saturated"):
            lines.append(f"  {engine['stall']['verdict'].upper():7} {name}: "
                         f"{display_text(engine['stall']['reason'])}")
    return "\n".join(lines) + "\n"


def _clock(seconds: float | None) -> str:
    """12s, 4m05s, 1h02m: a duration at the precision a person reads."""
    seconds = round(seconds or 0.0)
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """One line on stderr while a live check runs, rewritten at most once a second: time
    watched and left, engines seen, the worst state so far. Only on a terminal (a log file
    or cron mail gets nothing); cleared before the verdict is printed."""

    def __init__(self, duration_s: float, *, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.duration_s = duration_s
        self.clock = clock
        self.started = clock()
        self._shown_at = -math.inf

    def update(self, run: CheckRun) -> None:
        now = self.clock()
        if not self.enabled or now - self._shown_at < PROGRESS_PERIOD_S:
            return
        self._shown_at = now
        elapsed = now - self.started
        left = max(0.0, self.duration_s - elapsed)
        line = (f"kvtop check: {_clock(elapsed)} of {_clock(self.duration_s)} "
                f"({_clock(left)} left) · {run.engines_seen()} engine(s) seen · "
                f"worst so far: {run.verdict().upper()}")
        rewrite_line(self.stream, line)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._shown_at > -math.inf:
            erase_line(self.stream)
            self.stream.flush()


def print_result(run: CheckRun, as_json: bool | None) -> int:
    emit(run.to_json(), as_json, _render_text)
    return run.exit_code()


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "check", help=summary,
        description="Watch the targets for --duration (or read a recording with --replay, or "
                    "judge what Prometheus stored over the last --duration) through the leak "
                    "detector and print the worst verdict per engine (docs/check-json.md). "
                    "While watching, progress goes to stderr when it is a terminal.")
    add_target_arguments(parser)
    add_kv_events_argument(parser)
    parser.add_argument("--replay", type=Path, metavar="FILE",
                        help="judge a recording instead of live targets")
    add_time_range_arguments(parser, "--replay")
    parser.add_argument("--duration", type=parse_duration, default=None, metavar="D",
                        help="how long to watch live targets, or with --prometheus how far "
                             "back to judge (90s, 30m, 2h; default 30m)")
    parser.add_argument("--interval", type=positive_seconds, default=None, metavar="S",
                        help="seconds between scrapes (default 1; 5 with --prometheus)")
    parser.add_argument("--until-leak", action="store_true",
                        help="stop as soon as an engine is judged LEAK")
    parser.add_argument("--record", type=Path, metavar="FILE",
                        help="also write the live scrapes to a new recording")
    parser.add_argument("--record-max-size", type=size, default=DEFAULT_MAX_BYTES,
                        metavar="SIZE", help=MAX_SIZE_HELP)
    add_output_arguments(parser, ("--text",), "the human-readable verdict even when stdout "
                                              "is not a terminal (cron mail, tee)")
    add_prometheus_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from kvtop.collect.live import PrometheusFeed

    config = load_config(args.config)
    if args.replay is not None and (args.targets or args.duration or args.record
                                    or args.kv_events):
        raise ConfigError("--replay reads a recording: give no targets, --duration, "
                          "--kv-events or --record with it")
    span = time_range(args, args.replay, "--replay")
    try:
        with open_source(args, config, interval_s=args.interval, replay=args.replay) as source:
            if args.record and isinstance(source, PrometheusFeed):
                raise ConfigError("--record writes direct scrapes; Prometheus keeps its own "
                                  "history")
            duration = None if args.replay else args.duration or DEFAULT_DURATION_S
            return check(source, params=leak_params(config), limits=config.limits,
                         duration_s=duration, until_leak=args.until_leak, record=args.record,
                         record_max_bytes=args.record_max_size, as_json=args.as_json,
                         span=span)
    except RecordingError as exc:
        warn(f"kvtop check: {exc}")
        return EXIT_USAGE


def check(source: Source, *, params: LeakParams | None, duration_s: float | None,
          as_json: bool | None, until_leak: bool = False, record: Path | None = None,
          record_max_bytes: int | None = DEFAULT_MAX_BYTES,
          span: TimeRange | None = None, limits: dict[str, LimitParams] | None = None) -> int:
    """Judge ``source`` over ``duration_s`` (None: all it has stored, nothing live), print
    the verdicts; the exit code (130 after Ctrl-C, with the verdict so far). ``record`` also
    writes the live scrapes to a new recording; ``span`` cuts what is stored."""
    for warning in source.warnings:
        warn(f"kvtop check: {warning}")
    run = CheckRun(params, dict(limits or {}))
    with contextlib.ExitStack() as stack:
        writer = None
        if record is not None:
            try:
                writer = stack.enter_context(RecordingWriter(
                    record, interval_s=source.interval_s, targets=source.targets,
                    max_bytes=record_max_bytes))
            except OSError as exc:
                warn(f"kvtop check: cannot write {record}: {exc.strerror or exc}")
                return EXIT_USAGE
        try:
            asyncio.run(_judge(run, source, duration_s=duration_s, until_leak=until_leak,
                               writer=writer, span=span or TimeRange()))
        except SourceError as exc:
            warn(f"kvtop check: {exc}")  # it may quote what Prometheus said
            return EXIT_NO_DATA
    if writer is not None and (problem := writer.status()):
        # the verdict's exit code stands; the recording's trouble is told, not hidden
        warn(f"kvtop check: recording {record}: {problem}")
    return print_result(run, as_json)


async def _judge(run: CheckRun, source: Source, *, duration_s: float | None,
                 until_leak: bool, writer: RecordingWriter | None,
                 span: TimeRange = EVERYTHING) -> None:
    """What the source stored over ``duration_s`` at once (within ``span``), then what is
    left of it live."""
    async with opened(source):
        for target in await source.discover():
            run.add_target(target)
        stored, covered = await source.stored(duration_s, kv_events=True)
        for item in span.within(stored) if span else stored:
            if isinstance(item, TargetKvEvents):
                run.feed_kv_events(item.target, item.batch)
            else:
                run.feed(item)
        rest = 0.0 if duration_s is None else duration_s - covered
        live = source.live()
        if live is None or rest <= 0 or (until_leak and run.leak_found):
            return
        if covered > 0:
            warn(f"kvtop check: {source.name} keeps {covered:.0f} s of history; watching "
                 f"live for the other {rest:.0f} s")
        await _watch(run, live, source.kv_live(), duration_s=rest, until_leak=until_leak,
                     writer=writer)


async def _watch(run: CheckRun, live: ScrapeSource, kv_events: KvEventSource | None, *,
                 duration_s: float, until_leak: bool, writer: RecordingWriter | None) -> None:
    progress = Progress(duration_s)
    interrupted = stop_event()  # Ctrl-C, SIGTERM: told apart from the duration's end
    stop = asyncio.Event()
    relay = asyncio.create_task(_relay(interrupted, stop))

    def on_scrape(scrape: Scrape) -> None:
        run.feed(scrape)
        if writer is not None:
            writer.write(scrape)
            writer.flush()
        progress.update(run)

    def on_kv_events(item: TargetKvEvents) -> None:
        run.feed_kv_events(item.target, item.batch)
        if writer is not None:
            writer.write_kv_events(item.batch, item.target)

    try:
        await watch(live, on_scrape, duration_s=duration_s,
                    until=(lambda: run.leak_found) if until_leak else None, stop=stop,
                    kv_events=kv_events, on_kv_events=on_kv_events)
    finally:
        relay.cancel()
        progress.close()
    run.interrupted = interrupted.is_set()


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()
