"""The draw clock's rules with a fake timer and a fake monotonic clock: at most one frame a
redraw period, a first scrape's frame at once (coalesced), a frame each period without
scrapes, and --low-bandwidth's longer period."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvtop.ui.draw_clock import SOON_S, DrawClock


class FakeTimers:
    """Textual's set_timer, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.due: list[tuple[float, Callable[[], None]]] = []

    def set_timer(self, delay: float, callback: Callable[[], None]) -> None:
        self.due.append((self.now + delay, callback))

    def advance(self, seconds: float) -> None:
        """Move the clock on, firing every timer due by then, in order."""
        end = self.now + seconds
        while (ready := sorted((t, i) for i, (t, _) in enumerate(self.due) if t <= end)):
            t, index = ready[0]
            _, callback = self.due.pop(index)
            self.now = t
            callback()
        self.now = end


class Harness:
    def __init__(self, interval_s: float = 1.0, low_bandwidth: bool = False) -> None:
        self.timers = FakeTimers()
        self.frames: list[float] = []
        self.paused = False
        self.interval_s = interval_s
        self.clock = DrawClock(self.draw, interval_s=lambda: self.interval_s,
                               low_bandwidth=low_bandwidth, set_timer=self.timers.set_timer,
                               paused=lambda: self.paused, monotonic=lambda: self.timers.now)

    def draw(self) -> None:  # what the app's draw does when it draws
        self.frames.append(self.timers.now)
        self.clock.drawn()


def test_a_request_draws_now_when_the_last_frame_is_a_period_old() -> None:
    h = Harness()
    h.clock.request()
    assert h.frames == [100.0]
    h.timers.advance(1.0)
    h.clock.request()  # exactly one period later: drawn at once
    assert h.frames == [100.0, 101.0]


def test_requests_within_a_period_are_one_frame_at_its_end() -> None:
    h = Harness()
    h.clock.request()
    h.timers.advance(0.25)
    for _ in range(10):  # ten hosts answering within the period
        h.clock.request()
        h.timers.advance(0.05)
    assert h.frames == [100.0]
    h.timers.advance(1.0)
    assert h.frames == [100.0, 101.0]  # one frame, when the period ended


def test_a_request_a_hair_before_the_period_ends_waits_for_it() -> None:
    h = Harness()
    h.clock.request()
    h.timers.advance(0.999)
    h.clock.request()
    assert h.frames == [100.0]
    h.timers.advance(0.001)
    assert h.frames == [100.0, 101.0]


def test_first_numbers_are_drawn_at_once_together_and_not_while_paused() -> None:
    h = Harness()
    h.clock.request()
    for _ in range(500):  # a big fleet's first scrapes in one moment
        h.clock.soon()
    h.timers.advance(SOON_S)
    assert h.frames == [100.0, 100.0 + SOON_S]  # one frame, not a period later, not 500
    h.clock.soon()
    h.paused = True  # paused before it was due
    h.timers.advance(SOON_S)
    assert len(h.frames) == 2


def test_the_clock_ticks_each_period_without_requests() -> None:
    h = Harness(interval_s=2.0)
    h.clock.start()
    h.timers.advance(7.0)
    assert h.frames == [100.0, 102.0, 104.0, 106.0]  # ages keep counting


def test_a_frame_drawn_by_a_key_counts_for_the_period() -> None:
    h = Harness()
    h.clock.request()
    h.timers.advance(0.5)
    h.draw()  # a key press draws at once (force), outside the clock
    h.timers.advance(0.75)
    h.clock.request()  # 0.75 s after that frame: waits for the period
    assert h.frames == [100.0, 100.5]
    h.timers.advance(0.25)
    assert h.frames == [100.0, 100.5, 101.5]


@pytest.mark.parametrize(("interval_s", "low_bandwidth", "period_s"), [
    (1.0, False, 1.0), (0.25, False, 0.25), (0.25, True, 2.0), (1.0, True, 2.0),
    (1.5, True, 3.0), (5.0, True, 10.0),
])
def test_the_period_follows_the_interval_and_low_bandwidth_doubles_it_at_least_2s(
        interval_s: float, low_bandwidth: bool, period_s: float) -> None:
    assert Harness(interval_s, low_bandwidth).clock.period_s == period_s


def test_a_longer_interval_spaces_the_frames_from_the_last_one() -> None:
    h = Harness()
    h.clock.start()
    h.timers.advance(0.5)
    h.interval_s = 5.0  # `+` pressed
    h.timers.advance(12.0)
    assert h.frames == [100.0, 105.0, 110.0]


def test_after_a_soon_frame_the_next_first_numbers_get_their_own() -> None:
    h = Harness()
    h.clock.request()
    h.clock.soon()
    h.timers.advance(SOON_S)
    h.clock.soon()
    h.timers.advance(SOON_S)
    assert h.frames == [100.0, 100.0 + SOON_S, 100.0 + 2 * SOON_S]
