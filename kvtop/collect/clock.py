"""When a long-running headless command stops: Ctrl-C, SIGTERM, or its duration."""

from __future__ import annotations

import asyncio
import contextlib
import signal


def stop_event(duration_s: float | None = None) -> asyncio.Event:
    """An event set on SIGINT/SIGTERM or after ``duration_s``; call it inside the loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    if duration_s is not None:
        loop.call_later(duration_s, stop.set)
    return stop
