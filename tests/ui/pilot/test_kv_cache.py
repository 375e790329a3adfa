"""The KV cache in the running app (issue 29): real scrapes of vLLM 0.33 (149 requests
waiting for capacity) through real trackers, and KV event batches pushed through the app's
KV events tap: the cache pane beside the KV chart, the LIMIT column and the header's count,
the channel's state before a batch came, the exact leak evidence on its own line beside an
OK leak verdict, the small terminal's folded line and "blk" sparkline, the detail's lines,
--record writing the batches, and a replay folding the recorded batches as live."""

from __future__ import annotations

from pathlib import Path

from kvtop.collect.kv_events import BlockRemoved, BlockStored, KvEventBatch
from kvtop.collect.target import Scrape
from kvtop.store.recording import RecordingWriter, read_recording
from kvtop.ui.app import KvtopApp
from kvtop.ui.replay import replay_app
from kvtop.ui.screens.detail import DetailScreen
from tests.fakes.fake_kv_feed import FakeKvFeed
from tests.scenarios.app import HOST_A, T0, UNDER_LOAD, live_app, live_data_shown, table_rows
from tests.support.paths import fixture_text
from tests.support.waiting import eventually


def _text(app: KvtopApp, selector: str) -> str:
    return str(app.query_one(selector).render())


def batch(seq: int, *events: object) -> KvEventBatch:
    return KvEventBatch(t=T0 + seq, rank=0, seq=seq, ts=T0 + seq,
                        events=events)  # type: ignore[arg-type]


def churn(first: int, count: int) -> tuple[BlockStored, BlockRemoved]:
    hashes = tuple(range(first, first + count))
    return BlockStored(hashes, None, 16 * count, 16, "GPU"), BlockRemoved(hashes, "GPU")


async def test_the_cache_pane_the_limit_and_the_exact_evidence(tmp_path: Path) -> None:
    feed = FakeKvFeed([HOST_A])
    app, source = live_app(tmp_path, kv_events_factory=lambda _: feed,
                           record=tmp_path / "r.jsonl")
    async with app.run_test(size=(160, 48)) as pilot:
        assert await live_data_shown(pilot)
        host = next(r for r in table_rows(app) if r["name"] == "10.0.0.5:8000")
        assert host["limit"] == "KV cap"  # 149 wait for capacity on a full pool
        assert "held by KV 1" in _text(app, "#summary")
        await eventually(lambda: "KV events: connected to tcp://127.0.0.1:5557, no batch yet"
                         in _text(app, "#cache"), "the channel before any batch",
                         pause=pilot.pause)
        assert "limit  KV capacity" in _text(app, "#cache")
        # block 7 is stored once and never used again while 40,000 others come and go: more
        # than 3 turnovers of the 599-block pool of the twin's 0.33 scrape
        feed.push(HOST_A, batch(0, BlockStored((7,), None, 16, 16, "GPU")))
        for seq in range(1, 9):
            feed.push(HOST_A, batch(seq, *churn(100_000 * seq, 5000)))
        await eventually(lambda: feed.queue.empty(), "the batches folded", pause=pilot.pause)
        source.push(Scrape(HOST_A, T0 + 10, fixture_text(UNDER_LOAD)))
        cache = await eventually(lambda: "EVIDENCE" in _text(app, "#cache")
                                 and _text(app, "#cache"), "the evidence", pause=pilot.pause)
        assert "blocks +" in cache and "1 cached" in cache
        assert "exact  EVIDENCE 1 blocks unused 3+ turnovers" in cache
        head = _text(app, "#engine-head")
        assert "leak " in head and "KV events EVIDENCE 1 blocks" in head  # a line of its own

        feed.push(HOST_A, batch(9, *churn(900_000, 100)))
        await eventually(lambda: feed.queue.empty(), "the batch folded", pause=pilot.pause)
        source.push(Scrape(HOST_A, T0 + 11, fixture_text(UNDER_LOAD)))  # a rate: two scrapes
        await pilot.resize_terminal(80, 24)  # folds into a line and a sparkline
        panel = await eventually(lambda: "blk" in _text(app, "#engine") and
                                 _text(app, "#engine"), "the small panel", pause=pilot.pause)
        assert "cache limit KV cap" in panel and "exact EVIDENCE 1 blocks" in panel

        await pilot.resize_terminal(160, 48)
        await pilot.press("enter")
        info = await eventually(
            lambda: isinstance(app.screen, DetailScreen) and "exact   EVIDENCE" in
            str(app.screen.query_one("#detail-info").render()) and
            str(app.screen.query_one("#detail-info").render()), "the detail", pause=pilot.pause)
        assert "longest unused 0000000000000007" in info
        assert "limit   KV capacity" in info and "channel tcp://127.0.0.1:5557 connected" in info
        await pilot.press("q")
    batches = read_recording(tmp_path / "r.jsonl").kv_events
    assert [item.batch.seq for item in batches] == list(range(10))  # recorded with --record
    assert {item.target.url for item in batches} == {HOST_A.url}


async def test_a_replay_folds_the_recorded_batches_into_the_cache_pane(tmp_path: Path) -> None:
    """The replayed app gets the recording's KV event batches in their place among the
    scrapes (the replay source hands them to the app's tap): the exact evidence is back."""
    path = tmp_path / "kv.jsonl"
    body = fixture_text(UNDER_LOAD)
    with RecordingWriter(path, interval_s=1.0, targets=[HOST_A]) as writer:
        writer.write(Scrape(HOST_A, T0, body))
        writer.write_kv_events(batch(0, BlockStored((7,), None, 16, 16, "GPU")), HOST_A)
        for seq in range(1, 9):
            # 2,000 hashes a batch: within what a recording keeps (MAX_RECORDED_HASHES)
            writer.write_kv_events(batch(seq, *churn(100_000 * seq, 1000)), HOST_A)
        writer.write(Scrape(HOST_A, T0 + 10, body))
    app = replay_app(path, speed=100.0, snapshot_dir=tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        cache = await eventually(lambda: "EVIDENCE" in _text(app, "#cache")
                                 and _text(app, "#cache"), "the evidence", pause=pilot.pause)
        assert "exact  EVIDENCE 1 blocks unused 3+ turnovers" in cache
        assert "limit  KV capacity" in cache
