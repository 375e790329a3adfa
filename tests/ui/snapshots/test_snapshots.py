"""SVG snapshots of the main screen at 80x24, 120x40, 160x48 and 200x60 with and without
NVML, a resize, the detail view and the help (fixed clock and data: tests/scenarios/app.py),
and of a recording replayed through the real adapters and derivations. The README's
screenshots are these renders (scripts/screenshots.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtop.store.recording import read_recording
from kvtop.store.replay import MAX_SPEED, ReplaySource
from kvtop.ui.app import AppConfig
from kvtop.ui.replay import ReplayApp
from kvtop.ui.screens.detail import DetailScreen
from tests.fakes.fake_nvml import FakeGpuReader
from tests.scenarios.app import static_app, table_rows, write_recording
from tests.support.waiting import eventually

SIZES = [(80, 24), (120, 40), (160, 48), (200, 60)]


async def _settle(pilot) -> None:
    """Until the GPU read (in a thread) has landed and what it posted is handled."""
    app = pilot.app
    await eventually(lambda: app.gpu_watch.gpus or app.gpu_watch.unavailable, "the GPU read",
                     pause=pilot.pause)
    await pilot.pause()


async def _repainted(pilot) -> None:
    """Every widget painted afresh before the picture: without it, which cells a redraw
    timer happened to repaint (same text, segments split elsewhere) varies run to run."""
    for widget in pilot.app.screen.query("*"):
        widget.refresh()
    await pilot.pause()


def _then_repaint(step):
    async def run(pilot) -> None:
        await step(pilot)
        await _repainted(pilot)
    return run


async def _loaded(pilot) -> None:
    """The loaded, leaking llama-70b-a selected (third by name): every pane has data."""
    await _settle(pilot)
    await pilot.press("j", "j")
    pilot.app.clear_notifications()  # the LEAK toast would hide a pane (tested elsewhere)
    await pilot.pause(0.2)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fleet_view(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(static_app(), terminal_size=size, run_before=_then_repaint(_loaded))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fleet_view_without_nvml(snap_compare, size: tuple[int, int]) -> None:
    # a laptop without an NVIDIA driver: a GPU note at most, the fleet's numbers stay
    app = static_app(gpu_reader=FakeGpuReader(unavailable="NVML Shared Library Not Found"))
    assert snap_compare(app, terminal_size=size, run_before=_then_repaint(_loaded))


def test_a_server_that_never_answered_selected(snap_compare) -> None:
    assert snap_compare(static_app(), terminal_size=(120, 40), run_before=_then_repaint(_settle))


def test_resize_redraws_the_panes_at_once(snap_compare) -> None:
    async def shrink(pilot) -> None:
        await _loaded(pilot)
        await pilot.resize_terminal(100, 30)  # the charts take the new width
        await pilot.pause(0.2)


    assert snap_compare(static_app(), terminal_size=(200, 60), run_before=_then_repaint(shrink))


def test_resize_to_sparklines(snap_compare) -> None:
    async def shrink(pilot) -> None:
        await _loaded(pilot)
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.2)


    assert snap_compare(static_app(), terminal_size=(160, 48), run_before=_then_repaint(shrink))


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_detail_view(snap_compare, size: tuple[int, int]) -> None:
    async def open_detail(pilot) -> None:
        await _settle(pilot)
        await pilot.press("j", "j", "enter")  # the loaded llama-70b-a, third by name
        app = pilot.app
        await eventually(lambda: isinstance(app.screen, DetailScreen) and "num_gpu_blocks" in
                         str(app.screen.query_one("#detail-info").render()),
                         "the detail screen filled", pause=pilot.pause)
        app.clear_notifications()  # the STALLED alert takes the footer's line (tested elsewhere)
        await pilot.pause()

    assert snap_compare(static_app(), terminal_size=size, run_before=_then_repaint(open_detail))


def test_help_at_80x24(snap_compare) -> None:
    async def open_help(pilot) -> None:
        await _settle(pilot)
        await pilot.press("f1")
        pilot.app.clear_notifications()
        await pilot.pause(0.2)

    assert snap_compare(static_app(), terminal_size=(80, 24), run_before=_then_repaint(open_help))


def test_groups_by_model(snap_compare) -> None:
    async def group(pilot) -> None:
        await _settle(pilot)
        await pilot.press("f5", "f5", "j", "j", "j")  # the meta-llama group's row
        pilot.app.clear_notifications()
        await pilot.pause(0.2)

    assert snap_compare(static_app(), terminal_size=(160, 48), run_before=_then_repaint(group))


def test_gpu_unavailable_and_filtered(snap_compare) -> None:
    app = static_app(gpu_reader=FakeGpuReader(unavailable="NVML Shared Library Not Found"))

    async def filter_llama(pilot) -> None:
        await _settle(pilot)
        await pilot.press("slash", *"llama", "enter")

    assert snap_compare(app, terminal_size=(120, 30), run_before=_then_repaint(filter_llama))


def test_a_recording_replayed_to_its_end(snap_compare, tmp_path: Path) -> None:
    # Nothing made up: real scrapes through the adapters, rates, history and the leak
    # detector (the idle host holding 828 blocks is a LEAK by the end), as `kvtop replay`.
    path = write_recording(tmp_path / "rec.jsonl")
    recording = read_recording(path)
    source = ReplaySource(recording, speed=MAX_SPEED)
    config = AppConfig(targets=recording.targets(), source_factory=lambda _: source,
                       clock=source.now, no_gpu=True, snapshot_dir=tmp_path)
    app = ReplayApp(config, source, path.name)

    async def to_the_end(pilot) -> None:
        await eventually(lambda: source.finished and "■ END" in str(
            app.query_one("#replay").render()) and [r["leak"] for r in table_rows(app)][-1]
            .startswith("LEAK"), "the replay's end drawn", pause=pilot.pause)
        app.clear_notifications()  # the LEAK toast times out on the wall clock
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 30), run_before=to_the_end)
