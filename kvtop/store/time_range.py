"""A part of a recording by time: ``--since`` / ``--until`` of ``check --replay``,
``baseline save --from`` and ``compare --replay``.

A bound is a moment (ISO 8601, ``2026-07-01T12:00:00Z``; no zone is UTC) or an offset from
the recording's first scrape (``90s``, ``30m``, ``2h``, a number of seconds): the first 20
minutes of a 2-hour recording are ``--until 20m``, its last hour ``--since 1h``. A scrape
at a bound is inside the range.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol, TypeVar

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class Timed(Protocol):
    @property
    def t(self) -> float: ...


T = TypeVar("T", bound=Timed)  # a scrape, or a recording's KV event batch among them


class BadBound(ValueError):
    """Text that is neither a moment nor an offset; the message says what is accepted."""


@dataclass(frozen=True, slots=True)
class Bound:
    """A moment (unix seconds) or an offset (seconds after the first scrape)."""

    seconds: float
    offset: bool

    def at(self, start: float) -> float:
        return start + self.seconds if self.offset else self.seconds


def parse_bound(text: str) -> Bound:
    """``2026-07-01T12:00:00Z`` (a moment) or ``90s`` / ``30m`` / ``2h`` / ``1d`` / ``90``
    (an offset from the first scrape); BadBound otherwise."""
    cleaned = text.strip().lower()
    scale = UNITS.get(cleaned[-1:])
    try:
        value = float(cleaned[:-1] if scale else cleaned) * (scale or 1.0)
    except ValueError:
        return Bound(_moment(text.strip()), offset=False)
    if not math.isfinite(value) or value < 0:
        raise BadBound(f"an offset must be finite and >= 0 (got {text!r})")
    return Bound(value, offset=True)


def _moment(text: str) -> float:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadBound(f"not a time: {text!r} (an offset such as 30m, or a moment such as "
                       "2026-07-01T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


@dataclass(frozen=True, slots=True)
class TimeRange:
    since: Bound | None = None
    until: Bound | None = None

    def __bool__(self) -> bool:
        return self.since is not None or self.until is not None

    def within(self, scrapes: Iterable[T]) -> Iterator[T]:
        """The scrapes (in time order, KV event batches among them) inside the range;
        offsets count from the first."""
        start: float | None = None
        for scrape in scrapes:
            if start is None:
                start = scrape.t
            if self.since is not None and scrape.t < self.since.at(start):
                continue
            if self.until is not None and scrape.t > self.until.at(start):
                return
            yield scrape

    def describe(self) -> str:
        """The range as given, for a baseline's source or a message."""
        def said(bound: Bound) -> str:
            if bound.offset:
                return f"+{bound.seconds:g}s"
            return datetime.fromtimestamp(bound.seconds, tz=timezone.utc).isoformat(
                timespec="seconds")

        parts = [f"since {said(self.since)}" if self.since else "",
                 f"until {said(self.until)}" if self.until else ""]
        return " ".join(p for p in parts if p)
