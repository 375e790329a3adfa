"""The terminal watchdog: the app exits on SIGHUP or a lost TTY (stdin closed, or the parent
process gone) instead of spinning as an orphan (dolphie#101), and, when it owns the process,
makes sure the process ends even if shutting down hangs on a terminal that is gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textual.app import App

TTY_CHECK_S = 2.0


class TerminalWatchdog:
    def __init__(self, app: App[Any], before_exit: Callable[[], None]) -> None:
        """``before_exit``: what must reach the disk before the app goes (the recording)."""
        self._app = app
        self._before_exit = before_exit
        self._parent_pid = os.getppid()
        self.exit_deadline_s: float | None = None  # set by run_app: see exit_soon

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def hung_up(signum: int, frame: object) -> None:
            # a plain handler, not the loop's: it runs at once even when thousands of
            # targets keep the loop busy, and the exit deadline starts now
            self.exit_soon()
            loop.call_soon_threadsafe(self.terminal_gone)

        with contextlib.suppress(ValueError):  # not the main thread (tests)
            signal.signal(signal.SIGHUP, hung_up)
        self._app.set_interval(TTY_CHECK_S, self.check, name="tty-watchdog")

    def check(self) -> None:
        try:
            attached = sys.stdin.isatty()
        except (ValueError, OSError):  # stdin closed
            attached = False
        if not attached or os.getppid() != self._parent_pid:
            self.terminal_gone()

    def terminal_gone(self) -> None:
        self._before_exit()
        self.exit_soon()
        self._app.exit()

    def exit_soon(self) -> None:
        """When the app owns the process (run_app), end it in ``exit_deadline_s`` whatever
        happens: with the terminal gone, Textual's shutdown writes to it, and that write
        could block for good (seen with 10,000 targets in tmux). A normal exit before then
        ends the process as usual."""
        if self.exit_deadline_s is not None:
            force = threading.Timer(self.exit_deadline_s, os._exit, (0,))
            force.daemon = True
            force.start()
