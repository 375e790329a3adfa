"""The recording tap in a small app (Pilot) with a real RecordingWriter: what it writes
reaches the file at its flushes (every RECORD_FLUSH_S), each kind of trouble is told once as
a toast never read as markup (and the header asked to redraw), and without a writer, or
after closing, it does nothing."""

from __future__ import annotations

import random
from pathlib import Path

from textual.app import App
from textual.notifications import Notification
from textual.pilot import Pilot

from kvtop.collect.kv_endpoint import TargetKvEvents
from kvtop.collect.kv_events import BlockStored, KvEventBatch
from kvtop.collect.target import Scrape, Target
from kvtop.safe_text import json_text
from kvtop.store.format import kv_events_line, scrape_line
from kvtop.store.reader import read_recording
from kvtop.store.writer import FLUSH_BYTES, MIN_MAX_BYTES, RecordingWriter
from kvtop.ui.recording_tap import RECORD_FLUSH_S, RecordingTap
from tests.scenarios.app import UNDER_LOAD
from tests.support.full_disk import refused_writes_past
from tests.support.paths import fixture_text

TARGET = Target("http://10.0.0.5:8000/metrics")
BODY = fixture_text(UNDER_LOAD)
T0 = 1_700_000_000.0
BATCH = KvEventBatch(t=T0, rank=0, seq=0, events=(BlockStored((1,), None, 16, 16, "GPU"),))


class TapApp(App[None]):
    def __init__(self, writer: RecordingWriter | None) -> None:
        super().__init__()
        self.troubles = 0
        self.tap = RecordingTap(self, writer, on_trouble=self.trouble)

    def trouble(self) -> None:
        self.troubles += 1

    def on_mount(self) -> None:
        self.tap.start()

    def told(self) -> list[tuple[str, str, str, float, bool]]:
        shown: list[Notification] = list(self._notifications)
        return [(n.message, n.title, n.severity, n.timeout, n.markup) for n in shown]


async def said(pilot: Pilot[None]) -> tuple[list[tuple[str, str, str, float, bool]], int]:
    """The toasts shown (once the app has handled them) and the header's redraws asked."""
    await pilot.pause()
    app = pilot.app
    assert isinstance(app, TapApp)
    return app.told(), app.troubles


def writer(path: Path, max_bytes: int | None = None) -> RecordingWriter:
    return RecordingWriter(path, interval_s=1.0, targets=[TARGET], max_bytes=max_bytes)


def scrape(n: int, body: str = BODY) -> Scrape:
    return Scrape(TARGET, T0 + n, body=body)


def line_bytes(line: dict[str, object]) -> int:
    """A line's size in a recording, as the writer writes it."""
    return len(json_text(line, separators=(",", ":")).encode()) + 1


def noise(n: int) -> str:
    """A body of 300 KB that gzip only halves."""
    return f"# {random.Random(n).randbytes(150_000).hex()}\n"


async def test_written_at_each_flush_every_few_seconds_and_all_well_is_said_as_empty(
        tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    app = TapApp(writer(path))
    async with app.run_test() as pilot:
        [timer] = [t for t in app._timers if t.name == "record-flush"]
        assert timer._interval == RECORD_FLUSH_S == 5.0
        assert timer._callback == app.tap.flush
        app.tap.write(scrape(0))
        app.tap.write_kv_events(TargetKvEvents(TARGET, BATCH))
        assert read_recording(path).scrapes == []  # waiting for the flush
        app.tap.flush()
        recording = read_recording(path)
        assert [(s.t, s.body) for s in recording.scrapes] == [(T0, BODY)]
        assert recording.kv_events == [TargetKvEvents(TARGET, BATCH)]
        assert app.tap.status() == ""
        app.tap.close()
        app.tap.write(scrape(1))  # a late scrape after closing: not written, no error
        app.tap.write_kv_events(TargetKvEvents(TARGET, BATCH))
        app.tap.flush()
        assert app.tap.writer is None and app.tap.status() is None
        app.tap.close()
        assert await said(pilot) == ([], 0)
    assert len(read_recording(path).scrapes) == 1


async def test_without_a_writer_it_does_nothing(tmp_path: Path) -> None:
    app = TapApp(None)
    async with app.run_test() as pilot:
        assert [t.name for t in app._timers if t.name == "record-flush"] == []
        app.tap.write(scrape(0))
        app.tap.write_kv_events(TargetKvEvents(TARGET, BATCH))
        app.tap.flush()
        app.tap.close()
        assert app.tap.status() is None
        assert await said(pilot) == ([], 0)
    assert list(tmp_path.iterdir()) == []


async def test_failing_writes_are_told_once_until_they_work_again(tmp_path: Path) -> None:
    path = tmp_path / "rec [bold]x\x1b.jsonl"  # a name is outside text: never markup
    app = TapApp(writer(path))
    shown = f"{tmp_path}/rec [bold]x\\x1b.jsonl"
    async with app.run_test() as pilot:
        app.tap.write(scrape(0))
        app.tap.flush()
        with refused_writes_past(path.stat().st_size):
            app.tap.write(scrape(1))
            app.tap.flush()
            told = (f"{shown}: 1 lost (File too large)", "Recording", "error", 10, False)
            assert await said(pilot) == ([told], 1)
            assert app.tap.status() == "1 lost (File too large)"
            app.tap.write(scrape(2))
            app.tap.flush()  # still failing: said already
            assert await said(pilot) == ([told], 1)
        app.tap.write(scrape(3))
        app.tap.flush()  # written again: nothing new to say
        assert await said(pilot) == ([told], 1)
        assert app.tap.status() == "2 lost (File too large)"  # the count is the report
        with refused_writes_past(path.stat().st_size):
            app.tap.write(scrape(4))
            app.tap.flush()  # failing anew: said anew
        again = (f"{shown}: 3 lost (File too large)", "Recording", "error", 10, False)
        assert await said(pilot) == ([told, again], 2)


async def test_a_recording_that_reaches_its_size_is_told_once(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    app = TapApp(writer(path, max_bytes=MIN_MAX_BYTES))
    async with app.run_test() as pilot:
        for n in range(3):  # 900 KB: fits
            app.tap.write(scrape(n, noise(n)))
        app.tap.flush()
        assert await said(pilot) == ([], 0)
        app.tap.write(scrape(3, noise(3)))
        app.tap.flush()
        told = (f"{path}: stopped at 1 MiB", "Recording", "error", 10, False)
        assert await said(pilot) == ([told], 1)
        app.tap.write(scrape(4, noise(4)))
        app.tap.write_kv_events(TargetKvEvents(TARGET, BATCH))
        app.tap.flush()
        assert await said(pilot) == ([told], 1)
        assert app.tap.status() == "stopped at 1 MiB"


async def test_a_kv_event_batch_that_fills_the_recording_is_told(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    app = TapApp(writer(path, max_bytes=MIN_MAX_BYTES))
    async with app.run_test() as pilot:
        kv_line = line_bytes(kv_events_line(BATCH, TARGET.url))
        padding = line_bytes(scrape_line(scrape(0, ""))) + kv_line // 2
        app.tap.write(scrape(0, "#" * (FLUSH_BYTES - padding)))  # a line half a batch short of the
        assert await said(pilot) == ([], 0)  # bytes that go to disk without waiting
        app.tap.write_kv_events(TargetKvEvents(TARGET, BATCH))
        told = (f"{path}: stopped at 1 MiB", "Recording", "error", 10, False)
        assert await said(pilot) == ([told], 1)


async def test_a_full_recording_whose_end_is_lost_says_both(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl.gz"
    app = TapApp(writer(path, max_bytes=MIN_MAX_BYTES))
    async with app.run_test() as pilot:
        app.tap.write(scrape(0))
        app.tap.flush()
        for n in range(1, 8):  # 1 MiB of noise once gzipped
            app.tap.write(scrape(n, noise(n)))
        with refused_writes_past(path.stat().st_size):
            app.tap.flush()
        told = (f"{path}: stopped at 1 MiB, end not written (File too large)", "Recording",
                "error", 10, False)
        assert await said(pilot) == ([told], 1)


async def test_trouble_at_the_first_line_written_is_told(tmp_path: Path) -> None:
    """A line that goes to disk without waiting (FLUSH_BYTES) and fails, or fills the
    recording, as the very first."""
    big = scrape(0, "#" * FLUSH_BYTES)
    path = tmp_path / "refused.jsonl"
    app = TapApp(writer(path))
    async with app.run_test() as pilot:
        with refused_writes_past(path.stat().st_size):
            app.tap.write(big)
        told = (f"{path}: 1 lost (File too large)", "Recording", "error", 10, False)
        assert await said(pilot) == ([told], 1)
    path = tmp_path / "full.jsonl"
    app = TapApp(writer(path, max_bytes=MIN_MAX_BYTES))
    async with app.run_test() as pilot:
        app.tap.write(big)
        told = (f"{path}: stopped at 1 MiB", "Recording", "error", 10, False)
        assert await said(pilot) == ([told], 1)
