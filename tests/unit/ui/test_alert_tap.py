"""The alert tap in a small app (Pilot): each leak indicator change told once as a toast in
its state's title, severity and time, never as markup; entering LEAK or STALLED rings one
bell for the lot and runs the configured command (a real process) for each engine, with
that engine's event; a command that fails, or cannot start, is a toast, never a crash."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from textual.app import App
from textual.notifications import Notification
from textual.pilot import Pilot

from kvtop.collect.target import Target
from kvtop.config import AlertSettings
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.ui.alert_tap import LEAK_NOTIFY_S, AlertTap
from tests.scenarios.alerts import leaking_state
from tests.scenarios.app import LEAKING, QUIET, T0, until

WATCHING = LeakVerdict("watch", "floor rising", 80.0, 1234.0, 9.0)
FLAT = LeakVerdict("watch", "floor flat", 80.0, 0.0, None)
WEDGED = StallVerdict("stalled", "no token for 6 s", T0 - 6, {"waiting": 33.0})
MOVING = StallVerdict("ok", "making progress", None)
NOW = T0 + 5
Told = tuple[str, str, str, float, bool]


class AlertApp(App[None]):
    def __init__(self, settings: AlertSettings) -> None:
        super().__init__()
        self.tap = AlertTap(self, settings, clock=lambda: NOW)
        self.bells = 0
        self.started: list[tuple[str, str]] = []

    def run_worker(self, *args: Any, **kwargs: Any) -> Any:
        worker = super().run_worker(*args, **kwargs)
        self.started.append((worker.name, worker.group))
        return worker

    def bell(self) -> None:
        self.bells += 1

    def told(self) -> list[Told]:
        shown: list[Notification] = list(self._notifications)
        return [(n.message, n.title, n.severity, n.timeout, n.markup) for n in shown]


def appending_to(path: Path) -> tuple[str, ...]:
    """argv of a real program that appends what it reads on stdin to ``path``."""
    code = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read())"
    return (sys.executable, "-c", code, str(path))


def engine(name: str, leak: LeakVerdict | None = None,
           stall: StallVerdict | None = None) -> TargetState:
    state = leaking_state()
    state.target = Target.from_spec(f"10.0.0.{len(name)}:8000", name=name)
    state.engines = [replace(state.engines[0], leak=leak, stall=stall)]
    return state


def events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def looked(pilot: Pilot[None], *states: TargetState) -> list[Told]:
    app = pilot.app
    assert isinstance(app, AlertApp)
    app.tap.look(list(states))
    await pilot.pause()
    return app.told()


async def test_each_leak_change_told_once_in_its_states_words(tmp_path: Path) -> None:
    app = AlertApp(AlertSettings(bell=True))
    async with app.run_test() as pilot:
        assert await looked(pilot, engine("a [b]x[/b]\x1b", QUIET)) == []  # OK: no news
        watch = ("a [b]x[/b]\\x1b: floor rising (+1.2k/h)", "KV WATCH", "warning", 15.0,
                 False)
        assert await looked(pilot, engine("a [b]x[/b]\x1b", WATCHING)) == [watch]
        assert app.bells == 0  # WATCH: a toast only
        leak = ("a [b]x[/b]\\x1b: idle floor rose 2100 blocks in 30m beyond what the load "
                "explains (+4.2k/h)", "KV LEAK", "error", 30.0, False)
        assert await looked(pilot, engine("a [b]x[/b]\x1b", LEAKING)) == [watch, leak]
        assert await looked(pilot, engine("a [b]x[/b]\x1b", LEAKING)) == [watch, leak]
        assert app.bells == 1  # no command configured: none run
        assert await looked(pilot, engine("a [b]x[/b]\x1b", QUIET)) == [watch, leak, (
            "a [b]x[/b]\\x1b: pool drained to its idle floor: nothing leaked so far",
            "KV leak indicator cleared", "information", 5, False)]
        assert (app.bells, list(app.workers)) == (1, [])
    assert LEAK_NOTIFY_S == {"leak": 30.0, "watch": 15.0}


async def test_a_flat_trend_is_not_said(tmp_path: Path) -> None:
    app = AlertApp(AlertSettings(bell=False))
    async with app.run_test() as pilot:
        flat = replace(FLAT, slope_blocks_per_hour=None)
        assert await looked(pilot, engine("a", FLAT), engine("bb", flat)) == [
            ("a: floor flat", "KV WATCH", "warning", 15.0, False),
            ("bb: floor flat", "KV WATCH", "warning", 15.0, False)]


async def test_entering_leak_or_stalled_rings_once_and_runs_each_engines_command(
        tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    app = AlertApp(AlertSettings(bell=True, command=appending_to(out)))
    async with app.run_test() as pilot:
        quiet = [engine("a", QUIET, MOVING), engine("bb", QUIET, MOVING),
                 engine("ccc", QUIET, MOVING)]
        assert await looked(pilot, *quiet) == []
        news = [engine("a", QUIET, MOVING), engine("bb", LEAKING, MOVING),
                engine("ccc", WATCHING, WEDGED)]
        told = await looked(pilot, *news)
        assert [title for _, title, *_ in told] == ["KV LEAK", "KV WATCH", "STALLED"]
        assert told[2] == ("ccc: no token for 6 s", "STALLED", "error", 30.0, False)
        assert app.bells == 1  # one bell for the lot
        assert await until(pilot, lambda: out.exists() and len(events(out)) == 2)
        said = sorted((e["event"], e["name"], e["reason"], e["at"]) for e in events(out))
        at = "2026-01-01T00:00:05+00:00"  # T0 + 5: the tap's clock
        assert said == [("leak", "bb", LEAKING.reason, at), ("stall", "ccc", WEDGED.reason, at)]
        assert await looked(pilot, *news) == told  # nothing new: nothing more
        assert app.bells == 1
        assert app.started == [("run_alert", "alerts")] * 2


async def test_engines_entering_leak_or_stalled_together_each_run_the_command(
        tmp_path: Path) -> None:
    """The command's rate limit is per engine and event: none waits for another's."""
    out = tmp_path / "events.jsonl"
    app = AlertApp(AlertSettings(bell=True, command=appending_to(out)))
    async with app.run_test() as pilot:
        # one verdict object for both: each event is still its own engine's (an event once
        # looked its engine up by the verdict's identity and told "a" twice)
        await looked(pilot, engine("a", LEAKING), engine("bb", LEAKING),
                     engine("ccc", QUIET, WEDGED), engine("dddd", QUIET, WEDGED))
        assert await until(pilot, lambda: out.exists() and len(events(out)) == 4)
        assert sorted((e["event"], e["name"]) for e in events(out)) == [
            ("leak", "a"), ("leak", "bb"), ("stall", "ccc"), ("stall", "dddd")]
        assert app.bells == 1


async def test_what_was_told_is_told_again_after_a_rewind(tmp_path: Path) -> None:
    app = AlertApp(AlertSettings(bell=True))
    async with app.run_test() as pilot:
        leaking = engine("a", LEAKING, WEDGED)
        once = await looked(pilot, leaking)
        assert [title for _, title, *_ in once] == ["KV LEAK", "STALLED"]
        app.tap.forget()
        assert await looked(pilot, leaking) == once + once
        assert app.bells == 2


async def test_a_command_that_fails_or_cannot_start_is_a_toast(tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing")
    app = AlertApp(AlertSettings(bell=False, command=(missing,)))
    async with app.run_test() as pilot:
        await looked(pilot, engine("a", LEAKING))
        failed = (f"alert command {missing}: No such file or directory",
                  "Alert command failed", "error", 10, False)
        assert await until(pilot, lambda: failed in app.told())
        assert app.bells == 0


class LongFailure:
    """An argument the process cannot be started with, failing in a way no one planned."""

    def __fspath__(self) -> str:
        raise RuntimeError("[b]" + "x" * 400)


async def test_a_command_failing_in_an_unplanned_way_is_said_short(tmp_path: Path) -> None:
    settings = AlertSettings(bell=False, command=(LongFailure(),))  # type: ignore[arg-type]
    app = AlertApp(settings)
    async with app.run_test() as pilot:
        await looked(pilot, engine("a", LEAKING))
        said = "alert command: RuntimeError: [b]" + "x" * 267 + "…"
        assert await until(pilot, lambda: (said, "Alert command failed", "error", 10, False)
                           in app.told())
        assert app.is_running
