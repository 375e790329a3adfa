"""A part of a recording by time: the bounds people type and the scrapes they select."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kvtop.store.time_range import BadBound, Bound, TimeRange, parse_bound

NOON = 1782907200.0  # 2026-07-01T12:00:00Z


@pytest.fixture
def local_time_not_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A local zone 5h30 east of UTC, so that a moment read as local time is 19,800 s off."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0),
    ("90", 90.0), ("2.5", 2.5), (" 30M ", 1800.0), ("0", 0.0), ("0.5s", 0.5)])
def test_an_offset_is_seconds_after_the_first_scrape(text: str, seconds: float) -> None:
    assert parse_bound(text) == Bound(seconds, offset=True)


@pytest.mark.parametrize("text", ["-1", "-0.001m", "inf", "nan", "1e999s"])
def test_an_offset_must_be_finite_and_not_negative(text: str) -> None:
    with pytest.raises(BadBound) as raised:
        parse_bound(text)
    assert str(raised.value) == f"an offset must be finite and >= 0 (got {text!r})"


@pytest.mark.parametrize("text", ["2026-07-01T12:00:00Z", "2026-07-01t12:00:00z",
                                  " 2026-07-01T12:00:00+00:00 ", "2026-07-01T14:00:00+02:00"])
def test_a_moment_in_any_zone_is_unix_seconds(text: str) -> None:
    assert parse_bound(text) == Bound(NOON, offset=False)


@pytest.mark.usefixtures("local_time_not_utc")
def test_a_moment_without_a_zone_is_utc_not_local_time() -> None:
    assert parse_bound("2026-07-01T12:00:00") == Bound(NOON, offset=False)
    assert parse_bound("2026-07-01T17:30:00+05:30") == Bound(NOON, offset=False)


@pytest.mark.parametrize("text", ["yesterday", "12:00", "2026-13-01T00:00:00Z", "30x"])
def test_text_that_is_neither_says_what_is_accepted(text: str) -> None:
    with pytest.raises(BadBound) as raised:
        parse_bound(text)
    assert str(raised.value) == (f"not a time: {text!r} (an offset such as 30m, or a moment "
                                 "such as 2026-07-01T12:00:00Z)")


def test_a_bound_is_placed_against_the_first_scrape_only_when_an_offset() -> None:
    assert Bound(60.0, offset=True).at(1000.0) == 1060.0
    assert Bound(NOON, offset=False).at(1000.0) == NOON


@dataclass(frozen=True)
class Scrape:
    t: float


SCRAPES = [Scrape(1000.0 + 10 * i) for i in range(10)]  # 1000, 1010, ... 1090


def times(span: TimeRange) -> list[float]:
    return [scrape.t for scrape in span.within(SCRAPES)]


def test_an_empty_range_is_false_and_selects_everything() -> None:
    assert not TimeRange()
    assert times(TimeRange()) == [s.t for s in SCRAPES]


def test_scrapes_at_a_bound_are_inside_and_a_hair_beyond_are_not() -> None:
    span = TimeRange(since=Bound(20.0, offset=True), until=Bound(1050.0, offset=False))
    assert span
    assert times(span) == [1020.0, 1030.0, 1040.0, 1050.0]
    assert times(TimeRange(since=Bound(20.001, offset=True))) == [1030.0 + 10 * i
                                                                  for i in range(7)]
    assert times(TimeRange(until=Bound(49.999, offset=True))) == [1000.0, 1010.0, 1020.0,
                                                                  1030.0, 1040.0]


def test_a_range_with_one_bound_is_true() -> None:
    assert TimeRange(since=Bound(0.0, offset=True))
    assert TimeRange(until=Bound(0.0, offset=True))


def test_the_selection_stops_at_the_first_scrape_past_until() -> None:
    late_then_early = [Scrape(1000.0), Scrape(1100.0), Scrape(1001.0)]
    span = TimeRange(until=Bound(10.0, offset=True))
    assert [s.t for s in span.within(late_then_early)] == [1000.0]


@pytest.mark.parametrize(("span", "said"), [
    (TimeRange(), ""),
    (TimeRange(since=Bound(90.0, offset=True)), "since +90s"),
    (TimeRange(until=Bound(NOON, offset=False)), "until 2026-07-01T12:00:00+00:00"),
    (TimeRange(Bound(1.5, offset=True), Bound(NOON + 0.7, offset=False)),
     "since +1.5s until 2026-07-01T12:00:00+00:00")])
def test_a_range_is_described_as_given(span: TimeRange, said: str) -> None:
    assert span.describe() == said
