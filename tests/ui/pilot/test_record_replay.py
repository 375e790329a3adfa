"""Recording while the app runs, and the app replaying a recording with its keys."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from kvtop.collect.target import Scrape
from kvtop.store.recording import read_recording
from kvtop.store.replay import ReplaySource
from kvtop.ui.app import AppConfig, run_app
from kvtop.ui.replay import ReplayApp, run_replay
from tests.fakes.fake_nvml import FakeGpuReader
from tests.scenarios.app import (
    HOST_A,
    HOST_B,
    T0,
    TOKEN,
    UNDER_LOAD,
    live_app,
    live_data_shown,
    table_rows,
    until,
    write_recording,
)
from tests.support.paths import fixture_text
from tests.support.waiting import eventually

SIZE = (120, 30)


async def test_the_app_records_every_scrape_without_tokens(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl.gz"
    app, source = live_app(tmp_path, record=path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot)
        source.push(Scrape(HOST_B, T0 + 1, failure="down", error="connection refused"))
        assert await until(pilot, lambda: app.trackers[HOST_B.url].state.last_attempt_t == T0 + 1)
    recording = read_recording(path)
    assert [(s.target.url, s.t) for s in recording.scrapes] == [
        (s.target.url, s.t) for s in source.delivered
    ]
    assert recording.scrapes[0].body == fixture_text(UNDER_LOAD)
    assert recording.scrapes[-1].error == "connection refused"
    assert TOKEN not in gzip.decompress(path.read_bytes()).decode()


def test_an_unwritable_recording_is_a_message(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = AppConfig(targets=[HOST_A], record=blocker / "rec.jsonl")
    assert run_app(config) == 2
    assert "can't record to" in capsys.readouterr().err


def _recording(tmp_path: Path, seconds: int = 300) -> Path:
    return write_recording(tmp_path / "rec.jsonl", seconds)


def _replay_app(path: Path, tmp_path: Path, speed: float = 1.0) -> ReplayApp:
    recording = read_recording(path)
    source = ReplaySource(recording, speed=speed)
    config = AppConfig(targets=recording.targets(),
                       source_factory=lambda _: source, clock=source.now, no_gpu=True,
                       gpu_reader=FakeGpuReader(), snapshot_dir=tmp_path)
    return ReplayApp(config, source, path.name)


def _bar(app: ReplayApp) -> str:
    return str(app.query_one("#replay").render())


async def test_replay_keys_pause_step_seek_and_speed(tmp_path: Path) -> None:
    app = _replay_app(_recording(tmp_path), tmp_path)
    source = app.replay
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: "0:00/4:55" in _bar(app))
        assert "▶ REPLAY ×1  2026-01-01 00:00:00Z  0:00/4:55  rec.jsonl" in _bar(app)
        await pilot.press("space")
        assert source.paused and "PAUSED" in _bar(app)
        await pilot.press("full_stop")  # the next scrapes, 5 s on
        assert await until(pilot, lambda: source.now() == T0 + 5 and "0:05/4:55" in _bar(app))
        await pilot.press("full_stop")  # the bar's elapsed time moves with each step
        assert await until(pilot, lambda: source.now() == T0 + 10 and "0:10/4:55" in _bar(app))
        await pilot.press("right_square_bracket")  # +1 min: everything up to it folded
        assert await until(pilot, lambda: app.trackers[HOST_A.url].state.last_good_t == T0 + 70)
        assert source.now() == T0 + 70
        tracker = app.trackers[HOST_A.url]
        assert len(tracker.history[next(iter(tracker.history))]) == 15
        await pilot.press("left_square_bracket")  # -1 min: trackers rebuilt from the start
        assert await until(pilot, lambda: app.trackers[HOST_A.url] is not tracker
                           and source.now() == T0 + 10)
        rebuilt = app.trackers[HOST_A.url]
        assert await until(pilot, lambda: rebuilt.state.last_good_t == T0 + 10
                           and "0:10/4:55" in _bar(app))
        assert len(rebuilt.history[next(iter(rebuilt.history))]) == 3
        await pilot.press("greater_than_sign", "greater_than_sign")
        assert source.speed == 4.0
        await pilot.press("less_than_sign")
        assert source.speed == 2.0 and "×2" in _bar(app)


async def test_replay_runs_on_the_recording_clock(tmp_path: Path) -> None:
    app = _replay_app(_recording(tmp_path, seconds=30), tmp_path, speed=100.0)
    async with app.run_test(size=SIZE) as pilot:
        await eventually(lambda: "■ END" in _bar(app), "the replay's end", pause=pilot.pause)
        assert app.replay.finished and app.replay.now() == T0 + 25
        await eventually(lambda: [r["status"] for r in table_rows(app)] == ["up", "up"],
                         "both rows drawn up", pause=pilot.pause)
        rows = {r["name"]: r for r in table_rows(app)}
        assert rows["10.0.0.5:8001"]["kv"].endswith(" 828/1000")  # 172 of 1000 free


@pytest.mark.parametrize("content", [b"", b"not json\n", b'{"format": "other"}\n'])
def test_replay_of_an_unreadable_file_exits_2(tmp_path: Path, capsys, content: bytes) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    assert run_replay(path, speed=1.0, snapshot_dir=tmp_path) == 2
    assert capsys.readouterr().err.startswith("kvtop replay: ")


def test_replay_of_a_missing_file_exits_2(tmp_path: Path, capsys) -> None:
    assert run_replay(tmp_path / "nope.jsonl.gz", speed=1.0, snapshot_dir=tmp_path) == 2
    assert "nope.jsonl.gz" in capsys.readouterr().err
