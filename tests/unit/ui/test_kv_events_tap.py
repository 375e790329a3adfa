"""The app's KV events tap without a terminal: nothing runs where no target names an
endpoint, each target's state shows its channel once started, a batch goes to its own
target's tracker and the recording, and one for a target no tracker follows is dropped."""

from __future__ import annotations

import asyncio
from typing import Any

from kvtop.collect.kv_endpoint import TargetKvEvents
from kvtop.collect.kv_events import BlockStored, KvEventBatch
from kvtop.collect.target import Target
from kvtop.derive.tracker import TargetTracker
from kvtop.ui.kv_events_tap import KvEventsTap
from tests.fakes.fake_kv_feed import FakeKvFeed

A, B, ELSEWHERE = (Target.from_spec(f"10.0.0.{i}:8000") for i in (1, 2, 3))


class App:
    def __init__(self) -> None:
        self.workers: list[Any] = []

    def run_worker(self, work: Any, **kwargs: object) -> None:
        self.workers.append(work)
        work.close()  # never awaited here: the feed's run is the Pilot tier's


class Recording:
    def __init__(self) -> None:
        self.written: list[TargetKvEvents] = []

    def write_kv_events(self, item: TargetKvEvents) -> None:
        self.written.append(item)


def tap(feed: FakeKvFeed | None) -> tuple[KvEventsTap, App, Recording, dict[str, TargetTracker],
                                           list[int]]:
    app, recording, redraws = App(), Recording(), []
    trackers = {t.url: TargetTracker(t) for t in (A, B)}
    made = KvEventsTap(app, lambda: feed, lambda: trackers, recording,  # type: ignore[arg-type]
                       on_batch=lambda: redraws.append(1), stop=asyncio.Event())
    return made, app, recording, trackers, redraws


def test_no_feed_runs_nothing() -> None:
    made, app, _, trackers, _ = tap(None)
    made.start()
    assert app.workers == [] and all(t.state.kv_channel is None for t in trackers.values())


def test_a_batch_goes_to_its_targets_tracker_and_the_recording() -> None:
    feed = FakeKvFeed([A])
    made, app, recording, trackers, redraws = tap(feed)
    made.start()
    assert len(app.workers) == 1
    assert trackers[A.url].state.kv_channel is feed.channels[A.url]
    assert trackers[B.url].state.kv_channel is None  # names no endpoint: "KV events off"
    item = TargetKvEvents(A, KvEventBatch(t=1.0, rank=0, seq=0,
                                          events=(BlockStored((1,), None, 16, 16, "GPU"),)))
    made.fold(item)
    made.fold(TargetKvEvents(ELSEWHERE, item.batch))  # no tracker follows it: dropped
    assert list(trackers[A.url].kv_events) == [0] and trackers[B.url].kv_events == {}
    assert recording.written == [item] and redraws == [1]


class KeepingApp:
    """Textual's run_worker as far as the tap uses it: the work and how it is run."""

    def __init__(self) -> None:
        self.workers: list[tuple[Any, dict[str, object]]] = []

    def run_worker(self, work: Any, **kwargs: object) -> None:
        self.workers.append((work, kwargs))


async def test_the_worker_folds_the_feeds_batches_until_stopped() -> None:
    feed, app, recording = FakeKvFeed([A, ELSEWHERE]), KeepingApp(), Recording()
    stop = asyncio.Event()
    trackers = {A.url: TargetTracker(A)}  # ELSEWHERE's channel has no tracker to show it
    made = KvEventsTap(app, lambda: feed, lambda: trackers, recording,  # type: ignore[arg-type]
                       on_batch=lambda: None, stop=stop)
    made.start()
    assert made.feed is feed and trackers[A.url].state.kv_channel is feed.channels[A.url]
    [(work, how)] = app.workers
    assert how == {"group": "kv-events", "exit_on_error": False}
    running = asyncio.create_task(work)
    batch = KvEventBatch(t=1.0, rank=0, seq=0, events=(BlockStored((1,), None, 16, 16, "GPU"),))
    feed.push(A, batch)
    for _ in range(100):
        if recording.written:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(running, 5)
    assert recording.written == [TargetKvEvents(A, batch)]
