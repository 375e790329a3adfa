"""``kvtop check``: the leak detector's verdict, headless, live or on a recording.

Both paths feed scrapes through the same :class:`TargetTracker` (and so the same detector)
as the app; only the source differs. JSON contract: docs/check-json.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kvtop.collect.poller import Poller
from kvtop.collect.target import Scrape, Target
from kvtop.derive.leak import LeakParams, LeakVerdict
from kvtop.derive.tracker import EngineKey, TargetTracker
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
EXIT_OK, EXIT_LEAK, EXIT_USAGE, EXIT_NO_DATA = 0, 1, 2, 3


@dataclass(slots=True)
class EngineVerdict:
    """The worst state one engine reached, and when each state was first reached."""

    model: str | None
    engine: str | None
    verdict: Verdict = "unknown"
    leak_first_t: float | None = None
    watch_first_t: float | None = None
    at_worst: LeakVerdict | None = None  # the latest verdict while at the worst state

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
        }


@dataclass(slots=True)
class CheckRun:
    """Feeds scrapes through trackers and keeps each engine's worst verdict."""

    params: LeakParams | None = None
    trackers: dict[str, TargetTracker] = field(default_factory=dict)
    engines: dict[str, dict[EngineKey, EngineVerdict]] = field(default_factory=dict)

    def add_target(self, target: Target) -> None:
        if target.url not in self.trackers:
            self.trackers[target.url] = TargetTracker(target, leak_params=self.params)
            self.engines[target.url] = {}

    def feed(self, scrape: Scrape) -> None:
        self.add_target(scrape.target)
        state = self.trackers[scrape.target.url].update(scrape)
        if not scrape.ok or state.last_good_t != scrape.t:
            return
        verdicts = self.engines[scrape.target.url]
        for stats in state.engines:
            key = (stats.model, stats.engine)
            entry = verdicts.setdefault(key, EngineVerdict(stats.model, stats.engine))
            if stats.leak is not None:
                entry.observe(scrape.t, stats.leak)

    @property
    def leak_found(self) -> bool:
        return self.verdict() == "leak"

    def verdict(self) -> Verdict:
        verdicts = [e.verdict for per in self.engines.values() for e in per.values()]
        return max(verdicts, key=RANK.__getitem__, default="unknown")

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict(), "targets": [
            {"target": url, "engines": [e.to_json() for e in per.values()]}
            for url, per in self.engines.items()]}

    def exit_code(self) -> int:
        verdict = self.verdict()
        if verdict == "leak":
            return EXIT_LEAK
        return EXIT_NO_DATA if verdict == "unknown" else EXIT_OK


def _render_text(document: dict[str, Any]) -> None:
    print(f"kvtop check: {document['verdict'].upper()}")
    for target in document["targets"]:
        for engine in target["engines"]:
            name = f"{target['target']} {engine['model'] or ''} {engine['engine'] or ''}"
            print(f"  {engine['verdict'].upper():7} {display_text(name.strip())}: "
                  f"{display_text(engine['reason'])}")


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

    def on_scrape(scrape: Scrape) -> None:
        run.feed(scrape)
        if writer is not None:
            writer.write(scrape)
            writer.flush()
        if until_leak and run.leak_found:
            stop.set()

    async with Poller(targets, interval_s=interval_s, timeout_s=timeout_s,
                      insecure=insecure, narrow=not full_metrics) as poller:
        await poller.run(on_scrape, stop=stop)


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
