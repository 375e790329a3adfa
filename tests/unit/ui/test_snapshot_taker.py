"""``s`` in a small app (Pilot): the snapshot holds the document (each engine's history of the
span given, the GPUs and where they were looked for), each answering server's last body and
an SVG of the screen, written in a worker thread; where it went, or why it could not be
written, is said in a message that is never read as markup."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.notifications import Notification
from textual.widgets import Static
from textual.worker import WorkerState

from kvtop.collect.gpu import GpuReading
from kvtop.collect.target import Scrape, Target
from kvtop.derive.gpu_owners import GpuSource, GpuView, source_json, view_json
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.ui.snapshot_taker import SnapshotTaker
from tests.scenarios.app import UNDER_LOAD
from tests.support.paths import fixture_text
from tests.support.waiting import eventually

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
NAME = "kvtop-snapshot-20260101T000000Z"
SPAN_S = 300.0
UP = Target.from_spec("10.0.0.5:8000")
DOWN = Target.from_spec("10.0.0.6:8000")
GPU = GpuView(GpuReading(0, "NVIDIA H100 80GB HBM3", "GPU-1", 74 * 2**30, 80 * 2**30,
                         97.0, 61.0, 540.0), None, None)
NVML = GpuSource("nvml", None, None, "ok", None, 1)


class ScreenApp(App[None]):
    def compose(self) -> ComposeResult:
        yield Static("588/599 blocks [b]used[/b]")


def states() -> list[TargetState]:
    stats = EngineStats("m", "0", NOW, blocks_total=599, blocks_used=588.0)
    up = TargetState(UP, "up", kind="vllm", engines=[stats], last_good_t=NOW,
                     last_good=Scrape(UP, NOW, fixture_text(UNDER_LOAD)))
    return [up, TargetState(DOWN, "down", error="connection refused")]


def history() -> dict[str, dict[tuple[str, str], list[EngineStats]]]:
    """Just past the span, exactly at it, a hair inside it, now."""
    ages = (SPAN_S + 0.001, SPAN_S, SPAN_S - 0.001, 0.0)
    return {UP.url: {("m", "0"): [EngineStats("m", "0", NOW - age, blocks_used=500.0 + i)
                                  for i, age in enumerate(ages)]}}


async def take(app: App[None], folder: Path | None) -> list[Notification]:
    """Take a snapshot in ``app`` and wait for its worker and its message."""
    async with app.run_test(size=(80, 24)) as pilot:
        SnapshotTaker(app, folder, SPAN_S).take(NOW, states(), history(), [GPU], [NVML])
        [worker] = app.workers
        assert (worker.name, worker.group) == ("write_snapshot", "snapshot")
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()
        return list(app._notifications)


@pytest.fixture
def tokyo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time nine hours ahead of UTC: the snapshot's time must still be UTC."""
    monkeypatch.setenv("TZ", "JST-9")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def test_the_document_the_bodies_and_the_screen_and_where_they_went(
        tmp_path: Path, tokyo: None) -> None:
    [told] = await take(ScreenApp(), tmp_path)
    folder = tmp_path / NAME
    assert (told.message, told.severity, told.timeout, told.markup) == (
        f"Snapshot saved to {folder}", "information", 8, False)
    document = json.loads((folder / f"{NAME}.json").read_text())
    up, down = document["targets"]
    [series] = up["history"]
    assert series["t"] == [NOW - SPAN_S, NOW - SPAN_S + 0.001, NOW]  # the span, ends included
    assert series["blocks_used"] == [501.0, 502.0, 503.0]
    assert "history" not in down
    assert document["gpus"] == [view_json(GPU)]
    assert document["gpu_sources"] == [source_json(NVML)]
    assert document["taken_at"] == "2026-01-01T00:00:00.000+00:00"
    assert [p.name for p in (folder / "metrics").iterdir()] == ["10.0.0.5_8000.txt"]
    assert (folder / "metrics" / "10.0.0.5_8000.txt").read_text() == fixture_text(UNDER_LOAD)
    svg = (folder / "screen.svg").read_text()
    assert '>kvtop&#160;20260101T000000Z</text>' in svg  # the title: its time, UTC
    assert '>used</text' in svg  # the screen as drawn, not its markup


async def test_a_folder_that_cannot_be_written_is_said_in_an_error(tmp_path: Path) -> None:
    blocked = tmp_path / "a file"
    blocked.write_text("")
    [told] = await take(ScreenApp(), blocked)
    assert (told.message, told.severity, told.timeout, told.markup) == (
        f"Snapshot not written: {blocked} (Not a directory)", "error", 8, False)


async def test_the_default_folder_is_named_when_it_cannot_be_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "state").write_text("")  # $XDG_STATE_HOME is a file: no folder under it
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    [told] = await take(ScreenApp(), None)
    assert (told.message, told.severity) == (
        f"Snapshot not written: {tmp_path}/state/kvtop/snapshots (Not a directory)", "error")


async def test_a_write_that_fails_in_another_way_leaves_the_app_running(tmp_path: Path) -> None:
    app = ScreenApp()
    async with app.run_test(size=(80, 24)) as pilot:
        # a NUL byte in the folder: ValueError, not OSError (a bug, never the app's end)
        SnapshotTaker(app, tmp_path / "nul\0byte", SPAN_S).take(NOW, states(), {}, [], [])
        [worker] = app.workers
        await eventually(lambda: worker.is_finished, "the write given up", pause=pilot.pause)
        await pilot.pause()
        assert (worker.state, type(worker.error)) == (WorkerState.ERROR, ValueError)
        assert app.is_running and list(app._notifications) == []
