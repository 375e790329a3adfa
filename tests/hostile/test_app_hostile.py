"""The app on hostile servers and a hostile Prometheus (real HTTP on 127.0.0.1): what it
would write to the terminal holds only its own escape sequences, names are drawn as text
(never markup), selecting a hostile row or its detail does not crash, and the `s` bundle
keeps the exact values in JSON and a valid SVG."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from textual.app import App

from kvtop.collect.nvml import GpuProcess, GpuReading
from kvtop.collect.prometheus import PrometheusSettings, PrometheusSource
from kvtop.collect.target import Scrape, Secret, Target
from kvtop.safe_text import display_text
from kvtop.store.recording import RecordingWriter, read_recording
from kvtop.store.replay import ReplaySource
from kvtop.ui.app import AppConfig, KvtopApp
from kvtop.ui.replay import ReplayApp
from kvtop.ui.screens.detail import DetailScreen
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.fake_source import FakeSource
from tests.fakes.faultserver import FaultServer
from tests.hostile.hostile import (
    EVIL_CONFIG,
    EVIL_INSTANCE,
    EVIL_MODEL,
    OSC52,
    TOKEN,
    TOKEN_HEAD,
    FakePrometheus,
    foreign_controls,
    healthy_body,
    hostile_body,
)
from tests.scenarios.app import LEAKING_IDLE, T0, table_rows, until
from tests.support.paths import fixture_text

SIZE = (160, 48)


def terminal_output(app: App[None]) -> str:
    """Exactly what the app would write to the terminal for a full repaint of its screen
    (check it with ``foreign_controls(..., repaint=True)``)."""
    update = app.screen._compositor.render_update(full=True)
    app.screen.refresh()  # the repaint above cleared the screen's dirty regions
    assert update is not None
    return update.render_segments(app.console)


def rows_by_status(app: KvtopApp) -> dict[str, str]:
    return {row["name"]: row["status"] for row in table_rows(app)}


def svg_text(svg: str) -> str:
    return "".join(ET.fromstring(svg).itertext()).replace("\xa0", " ")


async def test_hostile_names_are_drawn_as_text_and_the_detail_opens(tmp_path: Path) -> None:
    async with FaultServer(bodies=[hostile_body()]) as evil, \
            FaultServer(bodies=[healthy_body()]) as good:
        targets = [Target.from_spec(evil.url(), name=f"cfg{OSC52}"),
                   Target.from_spec(good.url(), name="healthy")]
        app = KvtopApp(AppConfig(targets=targets, interval_s=0.5, no_gpu=True,
                                 gpu_reader=FakeGpuReader(), snapshot_dir=tmp_path))
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: set(rows_by_status(app).values()) == {"up"})
            screen = terminal_output(app)
            assert foreign_controls(screen, repaint=True) == []
            assert "cfg\\x1b]52;c;ZXZpbA==\\x07" in screen  # the config name, written out
            rows = {row["name"]: row for row in table_rows(app)}
            assert rows["healthy"]["model"] == "twin-llama"
            evil_row = next(r for r in rows.values() if r["model"] != "twin-llama")
            assert evil_row["model"] == display_text(EVIL_MODEL)

            app.table.action_cursor_to(0)  # the hostile row: "cfg…" sorts first
            await pilot.pause(0.1)
            title = app.panes._border_title  # the charts' pane at 160x48
            assert title is not None
            assert "[link='http://evil.example/x']click[/link]" in title.plain  # not a link

            await pilot.press("enter")
            assert await until(pilot, lambda: isinstance(app.screen, DetailScreen))
            info = app.screen.query_one("#detail-info").render()
            lines = str(info).splitlines()
            assert not any(line.startswith("FAKE ROW") for line in lines)
            assert any(display_text(EVIL_CONFIG) in line for line in lines)  # cache_config
            assert foreign_controls(terminal_output(app), repaint=True) == []

            await pilot.press("escape", "s")
            assert await until(pilot, lambda: list(tmp_path.glob("kvtop-snapshot-*")))
            assert app.is_running  # nothing above took it down
        (folder,) = tmp_path.glob("kvtop-snapshot-*")
        document = json.loads((folder / f"{folder.name}.json").read_text())
        models = {e["model"] for t in document["targets"] for e in t["engines"]}
        assert models == {EVIL_MODEL, "twin-llama"}  # exact in JSON
        shown = svg_text((folder / "screen.svg").read_text())  # parses as XML
        assert "cfg\\x1b]52" in shown and "twin-llama" in shown


async def test_a_leak_alert_for_a_model_named_like_markup_in_replay(tmp_path: Path) -> None:
    """A recording of a server with two models, one called "zz[/nope]", both leaking: the
    LEAK alerts name the models and are told (one raised MarkupError and ended the replay)."""
    leaking = Target(url="http://10.0.0.9:8000/metrics")
    real = fixture_text(LEAKING_IDLE)
    body = real + "".join(line.replace('model_name="twin-llama"', 'model_name="zz[/nope]"') + "\n"
                          for line in real.splitlines() if 'model_name="twin-llama"' in line)
    path = tmp_path / "leak.jsonl"
    with RecordingWriter(path, interval_s=5.0, targets=[leaking]) as writer:
        for t in range(0, 300, 5):
            writer.write(Scrape(leaking, T0 + t, body, version=f"0.10{OSC52}"))
    recording = read_recording(path)
    source = ReplaySource(recording)
    config = AppConfig(targets=recording.targets(), source_factory=lambda _: source,
                       clock=source.now, no_gpu=True, gpu_reader=FakeGpuReader(),
                       snapshot_dir=tmp_path)
    app = ReplayApp(config, source, f"leak{OSC52}.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(4):  # +4 min: past the idle confirmation
            await pilot.press("right_square_bracket")
        assert await until(pilot, lambda: any("zz[/nope]" in n.message
                                              for n in app._notifications))
        (alert,) = [n for n in app._notifications if "zz[/nope]" in n.message]
        assert alert.title == "KV LEAK" and not alert.markup
        await pilot.pause(0.2)  # the toast is drawn
        screen = terminal_output(app)
        assert "zz[/nope]" in screen and foreign_controls(screen, repaint=True) == []
        assert "leak\\x1b]52" in screen  # the replay bar's file name
        await pilot.press("enter")  # the detail shows the recorded version, written out
        assert await until(pilot, lambda: isinstance(app.screen, DetailScreen))
        assert "0.10\\x1b]52" in str(app.screen.query_one("#detail-info").render())
        assert app.is_running


async def test_a_hostile_prometheus_is_drawn_as_text_and_its_token_never_shown(
        tmp_path: Path) -> None:
    async with FakePrometheus() as prom:
        settings = PrometheusSettings(prom.url, token=Secret(TOKEN))
        source = PrometheusSource(settings, interval_s=0.5)
        targets = await source.discover()
        app = KvtopApp(AppConfig(targets=targets, source_factory=lambda _: source,
                                 no_gpu=True, gpu_reader=FakeGpuReader(),
                                 snapshot_dir=tmp_path))

        def down_row() -> dict[str, str]:
            return next(r for r in table_rows(app) if r["name"] == prom.down)

        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: rows_by_status(app).get(prom.healthy) == "up"
                               and rows_by_status(app).get(display_text(EVIL_INSTANCE)) == "up")
            # Prometheus's lastError for the down instance: masked, written out
            assert await until(pilot, lambda: "you sent Bearer ***" in down_row()["model"])
            assert down_row()["status"].startswith("down")
            screen = terminal_output(app)
            assert foreign_controls(screen, repaint=True) == [] and TOKEN_HEAD not in screen
            assert "10.9.9.9:8000\\x" in screen  # the instance label, written out (and cut)
            # F5 through every mode, hostile label names among them: raw bytes reached the
            # toast and the header, and "a[/]" stopped the app on a MarkupError (exit 70)
            for _ in range(8):
                await pilot.press("f5")
                await pilot.pause()
                screen = terminal_output(app)
                assert foreign_controls(screen, repaint=True) == [], screen[-400:]
            assert app.is_running and app.return_code is None
            await pilot.press("s")
            assert await until(pilot, lambda: list(tmp_path.glob("kvtop-snapshot-*")))
    (folder,) = tmp_path.glob("kvtop-snapshot-*")
    for path in folder.rglob("*"):
        if path.is_file():
            assert TOKEN_HEAD not in path.read_text(errors="replace"), path
    ET.parse(folder / "screen.svg")


HOSTILE_GPU = GpuReading(0, f"H100{OSC52}", "GPU-0", 1, 2, 50.0, 60.0, 300.0, processes=(
    GpuProcess(4242, f"python -m vllm{OSC52}\nFAKE", 1, True),
    GpuProcess(4243, "[/]oops[/bold]", None, False)))


@pytest.mark.parametrize("reader", [
    FakeGpuReader([HOSTILE_GPU]), FakeGpuReader(unavailable=f"driver{OSC52}[/]"),
], ids=["names", "nvml-error"])
async def test_gpu_and_process_names_are_written_out(reader: FakeGpuReader,
                                                     tmp_path: Path) -> None:
    """Any local user names their own processes (the GPU pane shows their command lines);
    an NVML error is a note in the header."""
    app = KvtopApp(AppConfig(targets=[], source_factory=lambda _: FakeSource(),
                             gpu_reader=reader, snapshot_dir=tmp_path))

    def gpu_text() -> str:
        return str(app.gpu_pane.render()) + str(app.summary.render())

    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: "\\x1b]52" in gpu_text())
        shown = gpu_text()
        assert "\x1b" not in shown and "FAKE" not in shown.replace("\\x0aFAKE", "")
        assert foreign_controls(terminal_output(app), repaint=True) == []
