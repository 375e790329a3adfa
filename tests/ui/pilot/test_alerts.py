"""Alerts while watching: entering LEAK or STALLED rings the bell and runs the configured command (a
real process, argv without a shell) with the event as JSON on stdin; rate-limited; a
failing, missing or hanging command is reported and never stops the app."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import replace
from pathlib import Path

from kvtop.collect.target import Scrape
from kvtop.config import AlertSettings
from kvtop.derive.verdicts import StallVerdict
from kvtop.ui.app import AppConfig, KvtopApp
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.fake_source import FakeSource
from tests.scenarios.alerts import copy_stdin_to, leaking_state
from tests.scenarios.app import LEAKING, QUIET, T0, StaticTracker, until


async def test_entering_leak_rings_and_runs_the_command_once(tmp_path: Path,
                                                             monkeypatch) -> None:
    out = tmp_path / "event.json"
    state = leaking_state()
    state.engines = [replace(state.engines[0], leak=QUIET)]
    tracker = StaticTracker(state, {("m", "0"): deque()})
    source = FakeSource([Scrape(state.target, T0)])
    app = KvtopApp(AppConfig(targets=[state.target], source_factory=lambda _: source,
                             tracker_factory=lambda _: tracker, gpu_reader=FakeGpuReader(),
                             clock=lambda: T0, snapshot_dir=tmp_path,
                             alerts=AlertSettings(command=copy_stdin_to(out))))
    bells: list[bool] = []
    monkeypatch.setattr(app, "bell", lambda: bells.append(True))
    async with app.run_test(size=(120, 40)) as pilot:
        assert await until(pilot, lambda: app.table.rows and source.delivered)
        assert not bells  # OK: nothing to say
        state.engines = [replace(state.engines[0], leak=LEAKING)]
        source.push(Scrape(state.target, T0 + 1))
        assert await until(pilot, lambda: out.exists() and out.read_text())
        assert bells == [True]
        assert json.loads(out.read_text())["event"] == "leak"
        source.push(Scrape(state.target, T0 + 2))  # still LEAK: told once
        assert await until(pilot, lambda: len(source.delivered) == 3)
        await pilot.pause(0.2)
        assert bells == [True]


WEDGED = StallVerdict("stalled", "KV pool 100% full with 33 requests waiting: no token "
                      "generated for 6 s (0 running)", T0 - 6, {"waiting": 33.0})


MOVING = StallVerdict("ok", "making progress", None)


async def test_entering_stalled_rings_and_runs_the_command_once_without_warmup(
        tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "event.json"
    state = leaking_state()
    warming = replace(LEAKING, state="warmup")  # the leak detector has not judged yet
    state.engines = [replace(state.engines[0], leak=warming, stall=MOVING)]
    tracker = StaticTracker(state, {("m", "0"): deque()})
    source = FakeSource([Scrape(state.target, T0)])
    app = KvtopApp(AppConfig(targets=[state.target], source_factory=lambda _: source,
                             tracker_factory=lambda _: tracker, gpu_reader=FakeGpuReader(),
                             clock=lambda: T0, snapshot_dir=tmp_path,
                             alerts=AlertSettings(command=copy_stdin_to(out))))
    bells: list[bool] = []
    monkeypatch.setattr(app, "bell", lambda: bells.append(True))
    async with app.run_test(size=(120, 40)) as pilot:
        assert await until(pilot, lambda: app.table.rows and source.delivered)
        state.engines = [replace(state.engines[0], stall=WEDGED)]
        source.push(Scrape(state.target, T0 + 1))
        assert await until(pilot, lambda: out.exists() and out.read_text())
        assert bells == [True]
        document = json.loads(out.read_text())
        assert document["event"] == "stall" and document["reason"] == WEDGED.reason
        assert document["stall"]["state"] == "stalled"
        assert any(n.title == "STALLED" for n in app._notifications)
        source.push(Scrape(state.target, T0 + 2))  # still STALLED: told once
        assert await until(pilot, lambda: len(source.delivered) == 3)
        await pilot.pause(0.2)
        assert bells == [True]


async def test_a_failing_command_is_shown_and_the_app_goes_on(tmp_path: Path) -> None:
    state = leaking_state()
    state.engines = [replace(state.engines[0], leak=QUIET)]
    tracker = StaticTracker(state, {})
    source = FakeSource([Scrape(state.target, T0)])
    app = KvtopApp(AppConfig(targets=[state.target], source_factory=lambda _: source,
                             tracker_factory=lambda _: tracker, gpu_reader=FakeGpuReader(),
                             clock=lambda: T0, snapshot_dir=tmp_path,
                             alerts=AlertSettings(bell=False,
                                                  command=(str(tmp_path / "nothing"),))))
    async with app.run_test(size=(120, 40)) as pilot:
        assert await until(pilot, lambda: source.delivered)
        state.engines = [replace(state.engines[0], leak=LEAKING)]
        source.push(Scrape(state.target, T0 + 1))
        assert await until(pilot, lambda: any(n.title == "Alert command failed"
                                              for n in app._notifications))
        assert app.is_running
