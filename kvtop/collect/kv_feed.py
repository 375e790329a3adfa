"""The KV events of every target that names an endpoint, as one live source beside the
scrapes: a subscriber per target (``kvtop.collect.kv_subscriber``), all run together, each
batch handed on with its target.

One bad endpoint never stops the others: a subscriber that cannot open its sockets (a
listening address in use, a host that is not this machine's) or stops on a bug says why in
its target's :class:`KvChannel` and the rest run on. A consumer's bug is logged and never
stops a subscriber.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from kvtop.collect.kv_endpoint import KvChannel, KvEventsEndpoint, OnKvEvents, TargetKvEvents
from kvtop.collect.kv_events import KvEventBatch
from kvtop.collect.target import Target

log = logging.getLogger(__name__)


class KvEventsFeed:
    """Subscribes to the endpoint of each target in ``endpoints`` (by target URL) while
    :meth:`run` runs; :attr:`channels` says how each stands."""

    def __init__(self, targets: Iterable[Target],
                 endpoints: Mapping[str, KvEventsEndpoint]) -> None:
        self.targets = [t for t in targets if t.url in endpoints]
        self.channels = {t.url: KvChannel(endpoints[t.url]) for t in self.targets}

    async def run(self, on_batch: OnKvEvents, *, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._subscribe(target, on_batch, stop)
                               for target in self.targets))

    async def _subscribe(self, target: Target, on_batch: OnKvEvents,
                         stop: asyncio.Event) -> None:
        from kvtop.collect.kv_subscriber import KvEventsSubscriber  # pyzmq, when used

        channel = self.channels[target.url]

        def deliver(batch: KvEventBatch) -> None:
            try:
                on_batch(TargetKvEvents(target, batch))
            except Exception:
                log.exception("on_batch failed for %s", target.label)

        subscriber = KvEventsSubscriber(channel.endpoint, deliver)
        channel.ranks = subscriber.statuses
        try:
            await subscriber.run(stop)
        except Exception as exc:  # the others go on; this channel says why it stopped
            log.warning("KV events of %s stopped: %r", target.label, exc)
            channel.error = str(exc) or type(exc).__name__
