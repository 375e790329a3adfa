"""The app's KV events: the source's subscribers run in a worker beside the scrapes (after
the first frame: pyzmq is imported then), each batch folded into its target's tracker at
once, even while the display is paused, written to the recording (``--record``), and a
redraw asked of the draw clock. Each tracker's state shows its target's channel (waiting,
connected, failed and why). A replay hands its recorded batches to :meth:`fold` too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from textual.app import App

    from kvtop.collect.kv_endpoint import KvChannel, OnKvEvents, TargetKvEvents
    from kvtop.collect.kv_events import KvEventBatch
    from kvtop.derive.tracker import TargetState
    from kvtop.ui.recording_tap import RecordingTap


class KvFeed(Protocol):
    """What the tap runs (:class:`~kvtop.collect.kv_feed.KvEventsFeed` in production)."""

    channels: Mapping[str, KvChannel]

    async def run(self, on_batch: OnKvEvents, *, stop: asyncio.Event) -> None: ...


class KvFolding(Protocol):
    """What folding a batch needs of a tracker."""

    @property
    def state(self) -> TargetState: ...

    def update_kv_events(self, batch: KvEventBatch) -> None: ...


class KvEventsTap:
    def __init__(self, app: App[Any], feed: Callable[[], KvFeed | None],
                 trackers: Callable[[], Mapping[str, Any]], recording: RecordingTap, *,
                 on_batch: Callable[[], None], stop: asyncio.Event) -> None:
        """``feed`` is made at :meth:`start` (None: no target names an endpoint);
        ``trackers`` is asked at each batch (a replay's rewind replaces them)."""
        self._app = app
        self._make_feed = feed
        self._trackers = trackers
        self._recording = recording
        self._on_batch = on_batch
        self._stop = stop
        self.feed: KvFeed | None = None

    def start(self) -> None:
        self.feed = self._make_feed()
        if self.feed is None:
            return
        for url, channel in self.feed.channels.items():
            tracker = self._trackers().get(url)
            if tracker is not None:
                tracker.state.kv_channel = channel
        self._app.run_worker(self._run(self.feed), group="kv-events", exit_on_error=False)

    async def _run(self, feed: KvFeed) -> None:
        await feed.run(self.fold, stop=self._stop)

    def fold(self, item: TargetKvEvents) -> None:
        tracker: KvFolding | None = self._trackers().get(item.target.url)
        if tracker is None:  # a target no tracker follows: nothing to show it with
            return
        tracker.update_kv_events(item.batch)
        self._recording.write_kv_events(item)  # never raises, as a scrape's write
        self._on_batch()
