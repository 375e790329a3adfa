"""Alerts while watching: entering LEAK or STALLED rings the bell and runs the configured command (a
real process, argv without a shell) with the event as JSON on stdin; rate-limited; a
failing, missing or hanging command is reported and never stops the app."""

from __future__ import annotations

import json
import sys
from collections import deque
from dataclasses import replace
from pathlib import Path

import pytest

from kvtop.alerts import AlertEvent, AlertRunner
from kvtop.collect.target import Scrape, Secret, Target
from kvtop.config import AlertSettings, ConfigError, load_config
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import StallVerdict
from kvtop.ui.app import AppConfig, KvtopApp
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.fake_source import FakeSource
from tests.ui.scenario import LEAKING, QUIET, T0, StaticTracker, until

SHELLISH = "llama; touch /tmp/kvtop-pwned $(id)"  # a model name no shell may ever see
TOKEN = "alert-token-never-shown"


def _copy_stdin_to(path: Path) -> tuple[str, ...]:
    """argv of a real program that writes what it reads on stdin to ``path``."""
    code = "import sys; open(sys.argv[1], 'w').write(sys.stdin.read())"
    return (sys.executable, "-c", code, str(path))


def _leaking_state() -> TargetState:
    target = Target.from_spec("10.0.0.5:8000", name="llama-a", group="prod",
                              token=Secret(TOKEN))
    stats = EngineStats(SHELLISH, "0", T0, kv_usage=0.9, blocks_total=1000, blocks_used=900,
                        running=3, waiting=7, leak=LEAKING)
    return TargetState(target, "up", kind="vllm", engines=[stats], last_good_t=T0)


def _event(state: TargetState) -> AlertEvent:
    return AlertEvent("leak", "key", "llama-a", state, state.engines[0], T0)


async def test_the_command_reads_the_event_as_json(tmp_path: Path) -> None:
    out = tmp_path / "event.json"
    runner = AlertRunner(AlertSettings(command=_copy_stdin_to(out)))
    assert await runner.run(_event(_leaking_state())) is None
    document = json.loads(out.read_text())
    assert document["kvtop_alert"] == 1 and document["event"] == "leak"
    assert document["model"] == SHELLISH  # exact, and never through a shell
    assert (document["name"], document["group"]) == ("llama-a", "prod")
    assert document["reason"] == LEAKING.reason
    assert document["leak"]["state"] == "leak"
    assert document["kv"] == {"usage": 0.9, "blocks_used": 900, "blocks_total": 1000}
    assert document["at"] == "2026-01-01T00:00:00+00:00"
    assert TOKEN not in out.read_text()
    assert not Path("/tmp/kvtop-pwned").exists()


async def test_a_failing_missing_or_hanging_command_is_reported(tmp_path: Path) -> None:
    event = _event(_leaking_state())
    failing = (sys.executable, "-c", "import sys; sys.stderr.write('no route\\n'); sys.exit(3)")
    said = await AlertRunner(AlertSettings(command=failing)).run(event)
    assert said is not None and said.endswith("exit status 3: no route")
    missing = (str(tmp_path / "no-such-program"),)
    said = await AlertRunner(AlertSettings(command=missing)).run(event)
    assert said is not None and "No such file or directory" in said
    hanging = (sys.executable, "-c", "import time; time.sleep(600)")
    said = await AlertRunner(AlertSettings(command=hanging, timeout_s=0.5)).run(event)
    assert said is not None and "killed" in said


def test_rate_limited_per_engine_and_in_all() -> None:
    now = [0.0]
    runner = AlertRunner(AlertSettings(command=("true",), min_interval_s=300,
                                       max_per_minute=3), clock=lambda: now[0])
    state = _leaking_state()
    first = _event(state)
    assert runner.due(first)
    assert not runner.due(first)  # the same engine again within min_interval_s
    now[0] = 301.0
    assert runner.due(first)
    others = [replace(first, key=f"k{i}") for i in range(3)]
    assert [runner.due(e) for e in others] == [True, True, False]  # 3 a minute in all
    now[0] = 362.0
    assert runner.due(others[2])
    assert runner.dropped == 2
    assert not AlertRunner(AlertSettings()).due(first)  # no command configured


async def test_entering_leak_rings_and_runs_the_command_once(tmp_path: Path,
                                                             monkeypatch) -> None:
    out = tmp_path / "event.json"
    state = _leaking_state()
    state.engines = [replace(state.engines[0], leak=QUIET)]
    tracker = StaticTracker(state, {("m", "0"): deque()})
    source = FakeSource([Scrape(state.target, T0)])
    app = KvtopApp(AppConfig(targets=[state.target], source_factory=lambda _: source,
                             tracker_factory=lambda _: tracker, gpu_reader=FakeGpuReader(),
                             clock=lambda: T0, snapshot_dir=tmp_path,
                             alerts=AlertSettings(command=_copy_stdin_to(out))))
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
    state = _leaking_state()
    warming = replace(LEAKING, state="warmup")  # the leak detector has not judged yet
    state.engines = [replace(state.engines[0], leak=warming, stall=MOVING)]
    tracker = StaticTracker(state, {("m", "0"): deque()})
    source = FakeSource([Scrape(state.target, T0)])
    app = KvtopApp(AppConfig(targets=[state.target], source_factory=lambda _: source,
                             tracker_factory=lambda _: tracker, gpu_reader=FakeGpuReader(),
                             clock=lambda: T0, snapshot_dir=tmp_path,
                             alerts=AlertSettings(command=_copy_stdin_to(out))))
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
    state = _leaking_state()
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


def test_alerts_config_is_an_argv_list(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[alerts]\nbell = false\ncommand = ["notify-send", "kvtop"]\n'
                    'min_interval_s = 60\n')
    assert load_config(path).alerts == AlertSettings(bell=False,
                                                      command=("notify-send", "kvtop"),
                                                      min_interval_s=60.0)
    for bad, said in (('command = "notify-send kvtop"', "list of strings"),
                      ("bell = 1", "true or false"),
                      ("min_interval_s = -1", "finite number > 0"),
                      ("colour = 'red'", "unknown key")):
        path.write_text(f"[alerts]\n{bad}\n")
        with pytest.raises(ConfigError, match=said):
            load_config(path)
