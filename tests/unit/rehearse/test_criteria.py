"""What the rehearsal's criteria share, at every edge: the load's span cut into thirds and
twelve windows (both ends of each, a hair either side), the report's rounding and signs."""

from __future__ import annotations

import math

import pytest

from kvtop.rehearse.criteria import STATE_RANK, WINDOWS, Span, rounded, signed

LATE = Span(100.0, 400.0)  # a load that starts late: every cut is measured from its start


@pytest.mark.parametrize(("t", "third"), [
    (50.0, 0), (100.0, 0), (199.999, 0), (200.0, 1), (299.999, 1), (300.0, 2), (400.0, 2),
    (900.0, 2)])
def test_thirds_are_counted_from_the_start_and_clamped(t: float, third: int) -> None:
    assert LATE.third(t) == third


@pytest.mark.parametrize(("t", "window"), [
    (50.0, 0), (124.999, 0), (125.0, 1), (374.999, 10), (375.0, 11), (400.0, 11), (900.0, 11)])
def test_windows_are_counted_from_the_start_and_clamped(t: float, window: int) -> None:
    assert WINDOWS == 12
    assert LATE.window(t) == window


def test_a_window_s_time_is_its_middle_in_hours() -> None:
    twelve_hours = Span(3600.0, 3600.0 * 13)
    assert [twelve_hours.window_hours(i) for i in (0, 1, 11)] == [0.5, 1.5, 11.5]


@pytest.mark.parametrize(("t", "held"), [
    (99.999, False), (100.0, True), (400.0, True), (400.001, False)])
def test_the_span_holds_both_its_ends(t: float, held: bool) -> None:
    assert LATE.holds(t) is held


def test_an_empty_span_still_has_a_length() -> None:
    assert Span(5.0, 5.0).length == 1e-9 and Span(5.0, 5.0).third(5.0) == 0


def test_rounded_keeps_six_digits_unless_told_and_drops_what_is_not_finite() -> None:
    assert rounded(1.23456789) == 1.234568
    assert rounded(1.25, 1) == 1.2 and rounded(1.26, 1) == 1.3
    assert [rounded(v) for v in (None, math.nan, math.inf, -math.inf)] == [None] * 4


def test_signed_shows_the_sign_or_a_question_mark() -> None:
    assert [signed(0.0123), signed(-0.0123), signed(0.0), signed(None)] == [
        "+1.2%", "-1.2%", "+0.0%", "?"]
    assert signed(2.5, ".1f") == "+2.5"


def test_states_rank_as_check_s_verdicts() -> None:
    assert sorted(STATE_RANK, key=STATE_RANK.__getitem__) == ["not_judged", "ok", "watch", "fail"]
