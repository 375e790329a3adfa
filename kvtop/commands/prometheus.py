"""``kvtop snapshot --prometheus`` and ``kvtop check --prometheus``: the same trackers,
detector and output as the direct commands, fed by :class:`PrometheusSource`."""

from __future__ import annotations

import asyncio
import sys

from kvtop.collect.clock import stop_event
from kvtop.collect.prometheus import PrometheusError, PrometheusSettings, PrometheusSource
from kvtop.collect.target import Scrape, Target
from kvtop.commands.check import Progress, print_result
from kvtop.commands.snapshot import EXIT_UNREADABLE, print_snapshot
from kvtop.derive.leak import LeakParams
from kvtop.derive.tracker import TargetState, TargetTracker
from kvtop.derive.worst import CheckRun
from kvtop.exits import EXIT_NO_DATA
from kvtop.safe_text import warn

SNAPSHOT_SCRAPES = 2  # the newest two scrapes per instance: values and rates


def latest_per_target(scrapes: list[Scrape], keep: int) -> list[Scrape]:
    """The newest ``keep`` scrapes of each target, in time order."""
    by_target: dict[str, list[Scrape]] = {}
    for scrape in sorted(scrapes, key=lambda s: s.t):
        by_target.setdefault(scrape.target.url, []).append(scrape)
    kept = [s for per in by_target.values() for s in per[-keep:]]
    return sorted(kept, key=lambda s: s.t)


async def collect_prometheus_states(source: PrometheusSource) -> list[TargetState]:
    """One read of what Prometheus stored lately, through one tracker per instance."""
    async with source:
        targets = await source.discover()
        scrapes = await source.poll_once()
    trackers = {t.url: TargetTracker(t) for t in targets}
    for scrape in latest_per_target(scrapes, SNAPSHOT_SCRAPES):
        tracker = trackers.setdefault(scrape.target.url, TargetTracker(scrape.target))
        tracker.update(scrape)
    return [trackers[url].state for url in sorted(trackers)]


def _fail(command: str, exc: PrometheusError) -> int:
    warn(f"kvtop {command}: {exc}")  # it may quote what Prometheus said
    return EXIT_UNREADABLE


def run_snapshot_prometheus(settings: PrometheusSettings, *, timeout_s: float | None,
                            insecure: bool, as_json: bool | None, with_gpus: bool) -> int:
    source = PrometheusSource(settings, timeout_s=timeout_s, insecure=insecure)
    try:
        states = asyncio.run(collect_prometheus_states(source))
    except PrometheusError as exc:
        return _fail("snapshot", exc)
    return print_snapshot(states, as_json=as_json, with_gpus=with_gpus)


async def _judge(run: CheckRun, source: PrometheusSource, *, duration_s: float,
                 until_leak: bool) -> None:
    """Feed what Prometheus stored over the last ``duration_s`` at once; only the part beyond
    its retention (if any) is watched live."""
    async with source:
        for target in await source.discover():
            run.add_target(target)
        retention = await source.retention_s()
        span = duration_s if retention is None else min(duration_s, retention)
        for scrape in await source.backfill(span):
            run.feed(scrape)
        rest = duration_s - span
        if rest > 0 and not (until_leak and run.leak_found):
            print(f"kvtop check: Prometheus keeps {span:.0f} s of history; watching live for "
                  f"the other {rest:.0f} s", file=sys.stderr)
            await _watch_live(run, source, rest, until_leak)


async def _watch_live(run: CheckRun, source: PrometheusSource, duration_s: float,
                      until_leak: bool) -> None:
    stop = stop_event(duration_s)
    progress = Progress(duration_s)

    def on_scrape(scrape: Scrape) -> None:
        run.feed(scrape)
        progress.update(run)
        if until_leak and run.leak_found:
            stop.set()

    try:
        await source.run(on_scrape, stop=stop, backfill=False)
    finally:
        progress.close()


def run_check_prometheus(settings: PrometheusSettings, *, params: LeakParams | None,
                         duration_s: float, interval_s: float, timeout_s: float | None,
                         insecure: bool, until_leak: bool, as_json: bool | None) -> int:
    """Judge the last ``duration_s`` from Prometheus's history, print the verdicts."""
    source = PrometheusSource(settings, interval_s=interval_s, timeout_s=timeout_s,
                              insecure=insecure)
    run = CheckRun(params or LeakParams())
    try:
        asyncio.run(_judge(run, source, duration_s=duration_s, until_leak=until_leak))
    except PrometheusError as exc:
        warn(f"kvtop check: {exc}")
        return EXIT_NO_DATA
    return print_result(run, as_json)


async def discover_targets(source: PrometheusSource) -> list[Target]:
    """The instances to open the app on (the app keeps one tracker per target)."""
    try:
        return await source.discover()
    finally:
        await source.aclose()  # the app runs the source again on its own event loop
