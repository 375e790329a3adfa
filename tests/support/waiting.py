"""Waiting in tests: for a state or an event, never for a fixed time.

On a loaded 2-core machine folding a scrape, starting a process or redrawing a table can
take seconds: a fixed pause before an assert makes a flaky test, and a wait loop that falls
through at its deadline makes a test that asserts nothing. These poll a condition until it
holds and fail, saying what was awaited, when a deadline meant as "never" passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# Generous: a deadline here is how long "it will never happen" takes to decide, not a
# measure of speed, so a slow machine only makes a failing test slower to fail.
DEADLINE_S = 60.0
POLL_S = 0.05


def _check(condition: Callable[[], T]) -> T | None:
    """The condition's value; a condition that raises (mid-transition) is not met yet."""
    try:
        return condition()
    except Exception:
        return None


def _gave_up(what: str, timeout_s: float, last: object) -> AssertionError:
    return AssertionError(f"gave up after {timeout_s:g} s waiting for {what} (last: {last!r})")


def wait_until(condition: Callable[[], T], what: str, *, timeout_s: float = DEADLINE_S,
               poll_s: float = POLL_S) -> T:
    """Poll ``condition`` until it returns something true, and return that; fail after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := _check(condition)):
        if time.monotonic() > deadline:
            raise _gave_up(what, timeout_s, value)
        time.sleep(poll_s)
    return value


async def eventually(condition: Callable[[], T], what: str, *,
                     timeout_s: float = DEADLINE_S,
                     pause: Callable[[float], Awaitable[object]] = asyncio.sleep) -> T:
    """``wait_until`` inside an event loop: ``pause`` lets the loop run between checks (a
    Textual test passes ``pilot.pause`` so the app processes its messages)."""
    deadline = time.monotonic() + timeout_s
    while not (value := _check(condition)):
        if time.monotonic() > deadline:
            raise _gave_up(what, timeout_s, value)
        await pause(POLL_S)
    return value
