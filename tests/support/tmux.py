"""Drive the real terminal: a tmux server of the test's own, its screen, the processes a test
started (found by its temporary folder in their command lines), a wait with a deadline."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class Tmux:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def __call__(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                              capture_output=True, text=True, timeout=10, check=False)
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "kv")

    def pane(self, field: str) -> str:
        return self("display-message", "-p", "-t", "kv", f"#{{{field}}}").strip()


def wait_for(check: Callable[[], object], timeout: float, what: str) -> None:
    """Until ``check()`` is true; ``timeout`` is a deadline for "never" (a loaded machine
    starts Python and draws slowly), not how long it should take."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"gave up after {timeout:g}s waiting for {what}")


def processes_with(marker: str, *, tmux_too: bool = True) -> list[int]:
    """Pids whose command line mentions ``marker`` (this test's temporary folder).

    The tmux server's own argv holds the command it was started with: ``tmux_too=False``
    leaves it out.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and (tmux_too or not cmdline.startswith("tmux")):
            found.append(int(entry.name))
    return found
