"""When a long-running command stops: after its duration, on SIGTERM, and outside the main
thread too."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator

import pytest

from kvtop.collect.clock import stop_event


async def test_a_long_command_stops_after_its_duration() -> None:
    stop = stop_event(0.05)
    assert not stop.is_set()
    await asyncio.wait_for(stop.wait(), timeout=30)


@pytest.fixture
async def sigterm_not_fatal() -> AsyncIterator[list[int]]:
    """SIGTERM handled by the test itself unless something installs its own handler."""
    reached: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: reached.append(signum))
    yield reached
    asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
    signal.signal(signal.SIGTERM, previous)


async def test_sigterm_stops_a_long_command(sigterm_not_fatal: list[int]) -> None:
    stop = stop_event(None)
    signal.raise_signal(signal.SIGTERM)
    await asyncio.wait_for(stop.wait(), timeout=30)
    assert sigterm_not_fatal == []  # the command's handler had it, not the default


def test_a_long_command_outside_the_main_thread_still_stops_after_its_duration() -> None:
    """Signal handlers can only be set in the main thread: elsewhere the duration alone."""
    stopped: list[bool] = []

    async def command() -> None:
        stop = stop_event(0.05)
        await asyncio.wait_for(stop.wait(), timeout=30)
        stopped.append(True)

    thread = threading.Thread(target=lambda: asyncio.run(command()))
    thread.start()
    thread.join(60)
    assert stopped == [True]
