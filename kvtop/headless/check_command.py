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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TextIO

from kvtop.collect.poller import Poller
from kvtop.collect.target import Scrape, Target
from kvtop.derive.leak import LeakParams, LeakVerdict
from kvtop.derive.stall import STALL_RANK, StallState, StallVerdict
from kvtop.derive.tracker import MAX_TRACKED_ENGINES, EngineKey, TargetTracker
from kvtop.headless.lifetime import stop_event
from kvtop.headless.output import emit, json_number
from kvtop.safe_text import display_text, warn
from kvtop.store.recording import (
    DEFAULT_MAX_BYTES,
    RecordingError,
    RecordingWriter,
    open_recording,
)

Verdict = Literal["unknown", "ok", "watch", "leak"]
RANK: dict[Verdict, int] = {"unknown": 0, "ok": 1, "watch": 2, "leak": 3}
EXIT_OK, EXIT_LEAK, EXIT_USAGE, EXIT_NO_DATA, EXIT_STALLED = 0, 1, 2, 3, 4
PROGRESS_PERIOD_S = 1.0


@dataclass(slots=True)
class EngineVerdict:
    """The worst state one engine reached, and when each state was first reached."""

    model: str | None
    engine: str | None
    verdict: Verdict = "unknown"
    leak_first_t: float | None = None
    watch_first_t: float | None = None
    at_worst: LeakVerdict | None = None  # the latest verdict while at the worst state
    stall: StallState = "unknown"  # the worst stall state reached
    stall_at_worst: StallVerdict | None = None
    stall_first_t: float | None = None  # first STALLED
    saturated_first_t: float | None = None  # first SATURATED

    def observe_stall(self, t: float, stall: StallVerdict) -> None:
        if stall.state == "stalled" and self.stall_first_t is None:
            self.stall_first_t = t
        if stall.state == "saturated" and self.saturated_first_t is None:
            self.saturated_first_t = t
        if STALL_RANK[stall.state] >= STALL_RANK[self.stall] and stall.state != "unknown":
            self.stall, self.stall_at_worst = stall.state, stall

    def observe(self, t: float, leak: LeakVerdict) -> None:
        state: Verdict = "unknown" if leak.state == "warmup" else leak.state
        if state == "leak" and self.leak_first_t is None:
            self.leak_first_t = t
        if state in ("watch", "leak") and self.watch_first_t is None:
            self.watch_first_t = t
        if RANK[state] >= RANK[self.verdict] and state != "unknown":
            self.verdict, self.at_worst = state, leak

    def to_json(self) -> dict[str, Any]:
        worst = self.at_worst
        return {
            "model": self.model, "engine": self.engine, "verdict": self.verdict,
            "leak_first_t": self.leak_first_t, "watch_first_t": self.watch_first_t,
            "leaked_blocks": json_number(worst.leaked_blocks if worst else None, 1),
            "slope_blocks_per_hour": json_number(worst.slope_blocks_per_hour if worst else None, 1),
            "reason": worst.reason if worst else "not enough data for a verdict",
            "stall": {
                "verdict": self.stall, "stalled_first_t": self.stall_first_t,
                "saturated_first_t": self.saturated_first_t,
                "reason": (self.stall_at_worst.reason if self.stall_at_worst
                           else "not enough data for a verdict")},
        }


@dataclass(slots=True)
class CheckRun:
    """Feeds scrapes through trackers and keeps each engine's worst verdict."""

    params: LeakParams | None = None
    trackers: dict[str, TargetTracker] = field(default_factory=dict)
    engines: dict[str, dict[EngineKey, EngineVerdict]] = field(default_factory=dict)
    first_t: float | None = None  # the span judged: first and last scrape fed, read or not
    last_t: float | None = None

    def add_target(self, target: Target) -> None:
        if target.url not in self.trackers:
            self.trackers[target.url] = TargetTracker(target, leak_params=self.params)
            self.engines[target.url] = {}

    def feed(self, scrape: Scrape) -> None:
        self.add_target(scrape.target)
        self.first_t = scrape.t if self.first_t is None else min(self.first_t, scrape.t)
        self.last_t = scrape.t if self.last_t is None else max(self.last_t, scrape.t)
        state = self.trackers[scrape.target.url].update(scrape)
        if not scrape.ok or state.last_good_t != scrape.t:
            return
        verdicts = self.engines[scrape.target.url]
        for stats in state.engines:
            key = (stats.model, stats.engine)
            entry = verdicts.setdefault(key, EngineVerdict(stats.model, stats.engine))
            if stats.leak is not None:
                entry.observe(scrape.t, stats.leak)
            if stats.stall is not None:
                entry.observe_stall(scrape.t, stats.stall)
        if len(verdicts) > MAX_TRACKED_ENGINES:
            _forget_unjudged(verdicts, {(s.model, s.engine) for s in state.engines})

    @property
    def leak_found(self) -> bool:
        return self.verdict() == "leak"

    def verdict(self) -> Verdict:
        verdicts = [e.verdict for per in self.engines.values() for e in per.values()]
        return max(verdicts, key=RANK.__getitem__, default="unknown")

    def stall_verdict(self) -> StallState:
        states = [e.stall for per in self.engines.values() for e in per.values()]
        return max(states, key=STALL_RANK.__getitem__, default="unknown")

    def engines_seen(self) -> int:
        return sum(len(per) for per in self.engines.values())

    def to_json(self) -> dict[str, Any]:
        span = None if self.first_t is None or self.last_t is None else self.last_t - self.first_t
        return {"verdict": self.verdict(), "stall": self.stall_verdict(),
                "started_at": _iso(self.first_t), "ended_at": _iso(self.last_t),
                "duration_s": json_number(span, 3),
                "targets": [{"target": url, "engines": [e.to_json() for e in per.values()]}
                            for url, per in self.engines.items()]}

    def exit_code(self) -> int:
        verdict = self.verdict()
        if verdict == "leak":
            return EXIT_LEAK
        if self.stall_verdict() == "stalled":
            return EXIT_STALLED
        return EXIT_NO_DATA if verdict == "unknown" else EXIT_OK


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="milliseconds")


def _forget_unjudged(verdicts: dict[EngineKey, EngineVerdict], current: set[EngineKey]) -> None:
    """Drop engines gone from the target that never got a verdict (a server inventing model
    names every scrape would otherwise grow the report without bound); a verdict, leak or
    stall, once reached, is the report and stays."""
    for key in [k for k, v in verdicts.items()
                if v.verdict == "unknown" and v.stall == "unknown" and k not in current]:
        del verdicts[key]


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
    for scrape in recording.in_time_order():
        run.feed(scrape)
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
