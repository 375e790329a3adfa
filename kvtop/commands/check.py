"""``kvtop check``: the leak detector's verdict, headless, live or on a recording.

Both paths feed scrapes through the same :class:`TargetTracker` (and so the same detector)
as the app; only the source differs. JSON contract: docs/check-json.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kvtop.collect.clock import stop_event
from kvtop.collect.poller import Poller
from kvtop.collect.target import Scrape, Target
from kvtop.derive.leak import LeakParams
from kvtop.derive.worst import CheckRun
from kvtop.exits import EXIT_USAGE
from kvtop.report.output import emit
from kvtop.safe_text import display_text, warn
from kvtop.store.recording import (
    DEFAULT_MAX_BYTES,
    RecordedKvEvents,
    RecordingError,
    RecordingWriter,
    open_recording,
)

PROGRESS_PERIOD_S = 1.0


def _render_text(document: dict[str, Any]) -> None:
    span = ""
    if document["started_at"] is not None:
        span = (f" ({_clock(document['duration_s'])} judged, {document['started_at']} to "
                f"{document['ended_at']})")
    stall = document["stall"]
    stall_text = f", {stall.upper()}" if stall in ("stalled", "saturated") else ""
    print(f"kvtop check: {document['verdict'].upper()}{stall_text}{span}")
    for target in document["targets"]:
        for engine in target["engines"]:
            name = display_text(
                f"{target['target']} {engine['model'] or ''} {engine['engine'] or ''}".strip())
            print(f"  {engine['verdict'].upper():7} {name}: {display_text(engine['reason'])}")
            if engine["stall"]["verdict"] in ("stalled", "saturated"):
                print(f"  {engine['stall']['verdict'].upper():7} {name}: "
                      f"{display_text(engine['stall']['reason'])}")


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
        self.stream.write(f"\r{line}\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._shown_at > -math.inf:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def print_result(run: CheckRun, as_json: bool | None) -> int:
    emit(run.to_json(), as_json, _render_text)
    return run.exit_code()


def run_check_replay(path: Path, *, params: LeakParams | None, as_json: bool | None) -> int:
    """Judge a recording, streamed from disk in time order (never held whole)."""
    try:
        recording = open_recording(path)
    except RecordingError as exc:
        warn(f"kvtop check: {exc}")
        return EXIT_USAGE
    for warning in recording.warnings:
        warn(f"kvtop check: {path}: {warning}")
    run = CheckRun(params)
    for target in recording.targets():
        run.add_target(target)
    for item in recording.items_in_time_order():
        if isinstance(item, RecordedKvEvents):
            run.feed_kv_events(item.target, item.batch)
        else:
            run.feed(item)
    return print_result(run, as_json)


async def _watch(run: CheckRun, targets: list[Target], *, duration_s: float,
                 interval_s: float, timeout_s: float | None, insecure: bool,
                 until_leak: bool, writer: RecordingWriter | None,
                 full_metrics: bool) -> None:
    stop = stop_event(duration_s)
    progress = Progress(duration_s)

    def on_scrape(scrape: Scrape) -> None:
        run.feed(scrape)
        if writer is not None:
            writer.write(scrape)
            writer.flush()
        progress.update(run)
        if until_leak and run.leak_found:
            stop.set()

    try:
        async with Poller(targets, interval_s=interval_s, timeout_s=timeout_s,
                          insecure=insecure, narrow=not full_metrics) as poller:
            await poller.run(on_scrape, stop=stop)
    finally:
        progress.close()


def run_check_live(targets: list[Target], *, params: LeakParams | None, duration_s: float,
                   interval_s: float, timeout_s: float | None, insecure: bool,
                   until_leak: bool, record: Path | None, as_json: bool | None,
                   full_metrics: bool = False,
                   record_max_bytes: int | None = DEFAULT_MAX_BYTES) -> int:
    run = CheckRun(params)
    for target in targets:
        run.add_target(target)
    with contextlib.ExitStack() as stack:
        writer = None
        if record is not None:
            try:
                writer = stack.enter_context(RecordingWriter(
                    record, interval_s=interval_s, targets=targets, max_bytes=record_max_bytes))
            except OSError as exc:
                warn(f"kvtop check: cannot write {record}: {exc.strerror or exc}")
                return EXIT_USAGE
        asyncio.run(_watch(run, targets, duration_s=duration_s, interval_s=interval_s,
                           timeout_s=timeout_s, insecure=insecure, until_leak=until_leak,
                           writer=writer, full_metrics=full_metrics))
    if writer is not None and (problem := writer.status()):
        # the verdict's exit code stands; the recording's trouble is told, not hidden
        warn(f"kvtop check: recording {record}: {problem}")
    return print_result(run, as_json)
