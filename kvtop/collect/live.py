"""The live sources: servers read directly (the poller), or the servers a Prometheus scrapes
(its HTTP API, with its history as the stored scrapes). Both are :class:`Source`\\ s, so a
command reads either through one path; each imports its HTTP stack only when first used.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar, cast

from kvtop.collect.source import Source, SourceError, latest_per_target
from kvtop.collect.target import Scrape, Target

if TYPE_CHECKING:
    from kvtop.collect.kv_endpoint import KvEventsEndpoint
    from kvtop.collect.poller import Poller
    from kvtop.collect.prometheus import PrometheusSettings, PrometheusSource

DIRECT_INTERVAL_S = 1.0
T = TypeVar("T")


class DirectSource(Source):
    """The targets' own ``/metrics``, read by the poller."""

    name = "the targets"

    def __init__(self, targets: Iterable[Target], *, interval_s: float | None = None,
                 timeout_s: float | None = None, insecure: bool = False,
                 narrow: bool = True,
                 kv_events: Mapping[str, KvEventsEndpoint] | None = None) -> None:
        super().__init__(targets, kv_events=kv_events)
        self.interval_s = interval_s or DIRECT_INTERVAL_S
        self.timeout_s, self.insecure, self.narrow = timeout_s, insecure, narrow

    def live(self) -> Poller:
        return cast("Poller", super().live())

    def _make_live(self) -> Poller:
        from kvtop.collect.poller import Poller

        return Poller(self.targets, interval_s=self.interval_s, timeout_s=self.timeout_s,
                      insecure=self.insecure, narrow=self.narrow)

    async def latest(self, count: int) -> list[Scrape]:
        """Every target read ``count`` times, ``interval_s`` apart (rates need two), in
        time order."""
        scrapes: list[Scrape] = []
        for round_number in range(count):
            started = time.monotonic()
            scrapes += await self.live().poll_once()
            if round_number < count - 1:
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
        return scrapes


class PrometheusFeed(Source):
    """The inference servers a Prometheus scrapes; what it stored is the history."""

    name = "Prometheus"

    def __init__(self, settings: PrometheusSettings, *, interval_s: float | None = None,
                 timeout_s: float | None = None, insecure: bool = False,
                 narrow: bool = True) -> None:
        from kvtop.collect.prometheus import PROMETHEUS_INTERVAL_S, PrometheusSource

        super().__init__()
        del narrow  # Prometheus is asked for kvtop's series only, always
        self.interval_s = interval_s or PROMETHEUS_INTERVAL_S
        self.source = PrometheusSource(settings, interval_s=self.interval_s,
                                       timeout_s=timeout_s, insecure=insecure)

    def _make_live(self) -> PrometheusSource:
        return self.source

    async def discover(self) -> list[Target]:
        self.targets = await _asked(self.source.discover())
        return self.targets

    async def stored(self, span_s: float | None, *,
                     kv_events: bool = False) -> tuple[list[Scrape], float]:
        """The last ``span_s`` (None: the detector's window) as far as Prometheus keeps it
        (it keeps no KV events)."""
        retention = await self.source.retention_s()
        span = self.source.window_s if span_s is None else span_s
        span = span if retention is None else min(span, retention)
        return await _asked(self.source.backfill(span)), span

    async def latest(self, count: int) -> list[Scrape]:
        """What Prometheus stored lately: the newest ``count`` scrapes of each instance."""
        return latest_per_target(await _asked(self.source.poll_once()), count)

    async def aclose(self) -> None:
        await self.source.aclose()  # whether or not it ran live: discovery opens it too


async def _asked(question: Awaitable[T]) -> T:
    """Prometheus's answer; its failure as the source's."""
    from kvtop.collect.prometheus import PrometheusError

    try:
        return await question
    except PrometheusError as exc:
        raise SourceError(str(exc)) from None
