"""The terminal watchdog in a small app (Pilot), on a real pseudo-terminal and a real SIGHUP:
the app stays while its terminal does, and exits (the recording flushed first) on a hang-up,
a closed stdin, a terminal that is no tty or a parent that is gone; when it owns the
process, the process ends by its deadline whatever happens."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from textual.app import App

from kvtop.ui.watchdog import TTY_CHECK_S, TerminalWatchdog


class WatchedApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[bool] = []
        self.watchdog = TerminalWatchdog(self, before_exit=self.flush)

    def flush(self) -> None:
        assert self.is_running  # what must reach the disk goes before the app does
        self.flushed.append(True)

    def on_mount(self) -> None:
        self.watchdog.start()


@pytest.fixture
def tty(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """stdin on a real pseudo-terminal; SIGHUP's handler put back afterwards."""
    controller, terminal = os.openpty()
    before = signal.getsignal(signal.SIGHUP)
    with os.fdopen(terminal, "r") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        yield stdin
    os.close(controller)
    signal.signal(signal.SIGHUP, before)


async def test_an_attached_terminal_keeps_the_app_and_is_checked_every_two_seconds(
        tty: Any) -> None:
    app = WatchedApp()
    async with app.run_test() as pilot:
        app.watchdog.check()
        await pilot.pause()
        assert app.is_running and app.flushed == []
        [timer] = [t for t in app._timers if t.name == "tty-watchdog"]
        assert timer._interval == TTY_CHECK_S == 2.0


async def test_a_closed_stdin_ends_the_app_at_the_next_check(tty: Any) -> None:
    app = WatchedApp()
    async with app.run_test() as pilot:
        tty.close()
        started = time.monotonic()
        while app.is_running and time.monotonic() - started < TTY_CHECK_S + 2:
            await pilot.pause(0.1)
        assert not app.is_running and app.flushed == [True]


async def test_stdin_that_is_no_terminal_ends_the_app(monkeypatch: pytest.MonkeyPatch,
                                                      tty: Any) -> None:
    app = WatchedApp()
    async with app.run_test() as pilot:
        with open(os.devnull) as null:
            monkeypatch.setattr(sys, "stdin", null)
            app.watchdog.check()
        await pilot.pause()
        assert not app.is_running and app.flushed == [True]


async def test_a_parent_that_is_gone_ends_the_app(monkeypatch: pytest.MonkeyPatch,
                                                  tty: Any) -> None:
    app = WatchedApp()
    async with app.run_test() as pilot:
        monkeypatch.setattr(os, "getppid", lambda: 1)  # reparented: to init
        app.watchdog.check()
        await pilot.pause()
        assert not app.is_running and app.flushed == [True]


async def test_a_hang_up_ends_the_app(tty: Any) -> None:
    app = WatchedApp()
    async with app.run_test() as pilot:
        os.kill(os.getpid(), signal.SIGHUP)
        started = time.monotonic()
        while app.is_running and time.monotonic() - started < 1:
            await pilot.pause(0.05)
        assert not app.is_running and app.flushed == [True]


def test_started_off_the_main_thread_it_checks_the_terminal_without_sighup(tty: Any) -> None:
    before = signal.getsignal(signal.SIGHUP)
    checks: list[list[str]] = []

    async def run() -> None:
        app = WatchedApp()
        async with app.run_test():
            checks.append([t.name for t in app._timers if t.name == "tty-watchdog"])

    thread = threading.Thread(target=asyncio.run, args=(run(),))  # no signal off the main one
    thread.start()
    thread.join(30)
    assert checks == [["tty-watchdog"]] and signal.getsignal(signal.SIGHUP) == before


def _timers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if isinstance(t, threading.Timer)]


async def test_the_process_ends_by_the_deadline_only_when_the_app_owns_it(
        monkeypatch: pytest.MonkeyPatch, tty: Any) -> None:
    ended: list[int] = []
    monkeypatch.setattr(os, "_exit", ended.append)
    app = WatchedApp()
    async with app.run_test() as pilot:
        before = _timers()
        app.watchdog.exit_soon()  # not the process's owner: no deadline
        assert _timers() == before and app.watchdog.exit_deadline_s is None
        app.watchdog.exit_deadline_s = 0.3
        app.watchdog.terminal_gone()
        [force] = [t for t in _timers() if t not in before]
        assert force.daemon  # a normal exit before then is not held up by it
        await pilot.pause(0.1)
        assert ended == []
        force.join(2)
        assert ended == [0]
