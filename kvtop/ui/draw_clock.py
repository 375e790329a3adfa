"""The app's one clock for redraws: every scrape, GPU read and key asks it for a frame, and
it draws at most once per redraw period (ten hosts at 1 Hz cost one frame a second), a
host's first numbers at once (coalesced with the other first scrapes of that moment), and
each period even without scrapes, so ages ("stale 12s") keep counting.

It holds no widget: it is given the draw, the poll interval and Textual's ``set_timer``,
so its rules are tested with a fake timer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

LOW_BANDWIDTH_PERIOD_S = 2.0  # the shortest redraw period with --low-bandwidth
SOON_S = 0.05  # a host's first numbers show this soon; 500 first scrapes, a few draws

SetTimer = Callable[[float, Callable[[], None]], object]


class DrawClock:
    def __init__(self, draw: Callable[[], None], *, interval_s: Callable[[], float],
                 low_bandwidth: bool, set_timer: SetTimer, paused: Callable[[], bool],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``interval_s``: the poll interval now (``+``/``-`` change it)."""
        self._draw = draw
        self._interval_s = interval_s
        self._low_bandwidth = low_bandwidth
        self._set_timer = set_timer
        self._paused = paused
        self._monotonic = monotonic
        self.last_draw = float("-inf")  # monotonic time of the last frame drawn
        self._period_end_armed = False
        self._soon_armed = False

    @property
    def period_s(self) -> float:
        """Numbers follow the poll interval; --low-bandwidth redraws at most every 2 s."""
        if self._low_bandwidth:
            return max(LOW_BANDWIDTH_PERIOD_S, 2 * self._interval_s())
        return self._interval_s()

    def drawn(self) -> None:
        """A frame was drawn now (whoever asked for it)."""
        self.last_draw = self._monotonic()

    def request(self) -> None:
        """Draw now if the last frame is a period old, else once when the period ends."""
        if self._period_end_armed:
            return
        wait = self.last_draw + self.period_s - self._monotonic()
        if wait <= 0:
            self._draw()
            return
        self._period_end_armed = True
        self._set_timer(wait, self._at_period_end)

    def soon(self) -> None:
        """Draw at once, with whatever else asks in the same moment: a host's first numbers
        (a big fleet's start would otherwise draw once per host), a server's GPUs found.
        Skipped if the display is paused by then."""
        if not self._soon_armed:
            self._soon_armed = True
            self._set_timer(SOON_S, self._soon_due)

    def start(self) -> None:
        """A frame each period even without scrapes (ages keep counting)."""
        self.request()
        self._set_timer(self.period_s, self.start)

    def _at_period_end(self) -> None:
        self._period_end_armed = False
        self._draw()

    def _soon_due(self) -> None:
        self._soon_armed = False
        if not self._paused():
            self._draw()
