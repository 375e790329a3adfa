"""Sources of scrapes: what every one of them is to the app and the commands.

A :class:`ScrapeSource` delivers :class:`Scrape`\\ s to a callback until stopped: the poller
(servers read directly), Prometheus, a replay, a test fake. A :class:`Source` is a source as
a command holds it: its targets, the scrapes it has stored already (a recording, Prometheus's
history) and the live source behind it, made when first asked for (the poller's HTTP stack
is imported then, not when kvtop starts). ``kvtop.cli_args.open_source`` opens the one the
command line names; ``kvtop.collect.watch`` feeds one into a consumer.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol, TypeVar

from kvtop.collect.kv_endpoint import OnKvEvents, TargetKvEvents
from kvtop.collect.target import Scrape, Target

if TYPE_CHECKING:
    from kvtop.collect.kv_endpoint import KvEventsEndpoint
    from kvtop.collect.kv_feed import KvEventsFeed

log = logging.getLogger(__name__)


OnScrape = Callable[[Scrape], "Awaitable[None] | None"]


class ScrapeSource(Protocol):
    """Anything that delivers scrapes: the poller, Prometheus, a replay, a test fake."""

    interval_s: float

    async def run(self, on_scrape: OnScrape, *, stop: asyncio.Event) -> None: ...


class KvEventSource(Protocol):
    """Anything that delivers KV event batches with their targets (the subscribers of
    :class:`~kvtop.collect.kv_feed.KvEventsFeed`, a test fake)."""

    async def run(self, on_batch: OnKvEvents, *, stop: asyncio.Event) -> None: ...


def read_scrape(scrape: Scrape, version: str | None = None) -> Scrape:
    """Make a good scrape's reading, in place: the one place a body (or the samples
    Prometheus parsed) becomes a :class:`ServerReading`, read with the server's exact
    ``version`` (default: the scrape's own, from ``/version``; without one the adapters
    infer it). A body the adapters refuse (over their limits, a value no KV pool can have)
    makes the scrape a ``bad_payload`` failure, with why."""
    if not scrape.ok or scrape.reading is not None:
        return scrape
    version = version or scrape.version
    # here, not at the top: the commands' parsers import this module, the adapters' tables
    # are only needed once there is something to read
    from kvtop.collect.adapters import adapt, read_exposition

    if scrape.samples is not None:
        reading = adapt(scrape.samples, version=version)
    else:
        reading = read_exposition(scrape.body or "", version=version)
    if reading.refused is not None:
        scrape.failure, scrape.error = "bad_payload", reading.refused
    else:
        scrape.reading = reading
    return scrape


class ScrapeReader:
    """Reads a stream of scrapes (a recording, played back) with each server's exact version
    as its ``/version`` last said it; a version the adapters inferred ("0.7+") is never read
    back as exact. One per pass over the stream."""

    def __init__(self) -> None:
        self._versions: dict[str, str] = {}  # target URL -> version; one per target read

    def __call__(self, scrape: Scrape) -> Scrape:
        if scrape.version:
            self._versions[scrape.target.url] = scrape.version
        return read_scrape(scrape, self._versions.get(scrape.target.url))


class SourceError(Exception):
    """A source that can't be read at all (Prometheus unreachable or empty); the message
    says why and may quote the server, so it goes through safe_text when shown."""


async def deliver(on_scrape: OnScrape, scrape: Scrape) -> None:
    """Hand one scrape on; the consumer's bug is logged and never stops the source."""
    try:
        outcome = on_scrape(scrape)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:
        log.exception("on_scrape failed for %s", scrape.target.label)


S = TypeVar("S")


@asynccontextmanager
async def opened(source: S) -> AsyncIterator[S]:
    """``source`` while the block runs, closed after it when it holds connections (the
    poller's HTTP session, Prometheus's)."""
    try:
        yield source
    finally:
        close = getattr(source, "aclose", None)
        if close is not None:
            await close()


class Source:
    """A source as a command or the app holds it. This base has no targets, nothing stored
    and nothing live; :mod:`kvtop.collect.live` and :mod:`kvtop.store.replay` have the
    kinds."""

    name = "the source"  # how messages name it
    interval_s = 1.0

    def __init__(self, targets: Iterable[Target] = (), *,
                 kv_events: Mapping[str, KvEventsEndpoint] | None = None) -> None:
        self.targets: list[Target] = list(targets)
        self.kv_events: dict[str, KvEventsEndpoint] = dict(kv_events or {})  # by target URL
        self._live: ScrapeSource | None = None
        self._kv_live: KvEventsFeed | None = None

    @property
    def warnings(self) -> list[str]:
        """What a person should know about the source before its verdict (lines skipped)."""
        return []

    async def discover(self) -> list[Target]:
        """The targets (a Prometheus is asked which it scrapes); SourceError when there is
        nothing to read."""
        return self.targets

    async def stored(self, span_s: float | None, *, kv_events: bool = False,
                     ) -> tuple[Iterable[Scrape | TargetKvEvents], float]:
        """The scrapes stored already over the last ``span_s`` (None: all of them), in time
        order, and the seconds they cover (``ALL``: everything there will ever be); with
        ``kv_events``, the KV event batches stored with them in their places."""
        return (), 0.0

    async def latest(self, count: int) -> list[Scrape]:
        """The newest ``count`` scrapes of each target, in time order (what a snapshot
        shows)."""
        scrapes, _ = await self.stored(None)
        return latest_per_target(scrapes, count)  # type: ignore[arg-type]

    def live(self) -> ScrapeSource | None:
        """What delivers scrapes from now on (made on the first call); None when the stored
        scrapes are all there is."""
        if self._live is None:
            self._live = self._make_live()
        return self._live

    def _make_live(self) -> ScrapeSource | None:
        return None

    def kv_live(self) -> KvEventsFeed | None:
        """What delivers the targets' KV events from now on, beside :meth:`live` (made on the
        first call: pyzmq is imported then); None where no target names an endpoint."""
        if self._kv_live is None and self.kv_events:
            from kvtop.collect.kv_feed import KvEventsFeed

            self._kv_live = KvEventsFeed(self.targets, self.kv_events)
        return self._kv_live

    async def aclose(self) -> None:
        close = getattr(self._live, "aclose", None)
        if close is not None:
            await close()


ALL = math.inf  # a stored span that covers everything the source will ever have


def latest_per_target(scrapes: Iterable[Scrape], keep: int) -> list[Scrape]:
    """The newest ``keep`` scrapes of each target, in time order."""
    by_target: dict[str, list[Scrape]] = {}
    for scrape in sorted(scrapes, key=lambda s: s.t):
        by_target.setdefault(scrape.target.url, []).append(scrape)
    kept = [s for per in by_target.values() for s in per[-keep:]]
    return sorted(kept, key=lambda s: s.t)
