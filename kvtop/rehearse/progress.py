"""Progress while a rehearsal runs: one line kept up to date on a terminal (every second),
a plain line a minute otherwise (logs, CI). Written to stderr; the report goes to stdout.

The line shows the rate achieved (answers a second over the last minute, target time), and
the criteria's states so far: provisional ("ok?", "fail?") until the load has ended and
they are judged, except what is certain already ("KV LEAK", "STALL").
After the load it says what the run waits for: the requests still in flight (draining, up
to the request timeout) and then the server going idle for the last reading, so the line
never stands still for a minute without saying why."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from typing import TextIO

from kvtop.derive.samples import percentile
from kvtop.load.driver import RequestRecord, RunClock
from kvtop.rehearse.report import clock as hms
from kvtop.rehearse.requests import RequestTable
from kvtop.safe_text import out, rewrite_line

TTY_EVERY_S = 1.0  # wall seconds
LINE_EVERY_S = 60.0
RECENT_S = 60.0  # target seconds of answers behind "current" p50/p99
CRITERIA_EVERY = 10  # refresh the criteria's states every this many terminal updates


class Progress:
    """Keeps the recent answers; ``run`` prints until cancelled."""

    def __init__(self, stream: TextIO, clock: RunClock, duration_s: float,
                 table: RequestTable | None, kv_usage: Callable[[], float | None],
                 criteria: Callable[[], dict[str, str]]) -> None:
        self.stream = stream
        self.clock = clock
        self.duration_s = duration_s
        self.table = table
        self.kv_usage = kv_usage
        self.criteria = criteria
        self.tty = stream.isatty()
        self.load_start = 0.0
        self._recent: deque[tuple[float, float]] = deque()
        self._answers: deque[float] = deque()  # when each first attempt was answered
        self._states: dict[str, str] = {}
        self._draining: tuple[float, Callable[[], int]] | None = None
        self._settling = False

    def drain(self, until: float, in_flight: Callable[[], int]) -> None:
        """The load stopped: requests in flight are waited for until ``until`` (the run's
        clock), then cut."""
        self._draining = (until, in_flight)

    def settle(self) -> None:
        """Every request is done: the run waits for the server to go idle."""
        self._settling = True

    def add(self, record: RequestRecord) -> None:
        if record.status != "ok" or record.attempt != 1:
            return
        now = self.clock.now()
        self._answers.append(now)
        if record.ttft_s is not None:
            self._recent.append((now, record.ttft_s))

    def say(self, text: str) -> None:
        """A line of its own (stopping early, say), above the progress line."""
        if self.tty:
            rewrite_line(self.stream, text)
            self.stream.write("\n")
        else:
            out(text + "\n", self.stream)
        self.stream.flush()

    def rate(self, now: float) -> float:
        """Answers a second over the last RECENT_S (since the load began, if sooner)."""
        while self._answers and self._answers[0] < now - RECENT_S:
            self._answers.popleft()
        seconds = min(RECENT_S, now - self.load_start)
        return len(self._answers) / seconds if seconds > 0 else 0.0

    async def run(self) -> None:
        every = TTY_EVERY_S if self.tty else LINE_EVERY_S
        updates = 0
        try:
            while True:
                await asyncio.sleep(every)
                if updates % (CRITERIA_EVERY if self.tty else 1) == 0:
                    self._states = self.criteria()
                updates += 1
                self._print(self.line())
        finally:
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()

    def line(self) -> str:
        now = self.clock.now()
        while self._recent and self._recent[0][0] < now - RECENT_S:
            self._recent.popleft()
        ttfts = [v for _, v in self._recent]
        parts = [self._phase(now)]
        if self.table is not None:
            table = self.table
            parts.append(f"{table.statuses['ok']} done, {table.failed} failed, "
                         f"{table.statuses['dropped']} dropped, {self.rate(now):.2f} req/s")
            parts.append(f"TTFT p50 {_ms(percentile(ttfts, 0.5))} "
                         f"p99 {_ms(percentile(ttfts, 0.99))}")
        usage = self.kv_usage()
        parts.append(f"KV {'-' if usage is None else f'{usage:.0%}'}")
        if self._states:
            parts.append(" ".join(f"{k} {v}".rstrip() for k, v in self._states.items()))
        return " | ".join(parts)

    def _phase(self, now: float) -> str:
        if self._settling:
            return "load done; waiting for the server to go idle for the last reading"
        if self._draining is not None:
            until, in_flight = self._draining
            return (f"load done ({hms(self.duration_s)}); draining {in_flight()} in flight, "
                    f"{hms(max(until - now, 0.0))} at most")
        return f"{hms(now - self.load_start)} / {hms(self.duration_s)}"

    def _print(self, line: str) -> None:
        if self.tty:
            rewrite_line(self.stream, line)
        else:
            out(line + "\n", self.stream)
        self.stream.flush()


def _ms(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s"
