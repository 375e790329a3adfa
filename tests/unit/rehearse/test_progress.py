"""The rehearsal's progress line: the rate achieved, the criteria's states as provisional
until judged, what is certain already (a confirmed LEAK, a STALL), a line of its own for
stopping early, and after the load what it waits for (draining, then the server going idle):
it never stands still without saying why."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable

import pytest

from kvtop.load.driver import RequestRecord, RunClock
from kvtop.rehearse.progress import RECENT_S, Progress
from kvtop.rehearse.requests import RequestTable


class Clock(RunClock):
    """Target time set by the test."""

    def __init__(self) -> None:
        super().__init__(1.0)
        self.t = 0.0

    def now(self) -> float:
        return self.t


class FixedClock(Clock):
    def __init__(self, t: float) -> None:
        super().__init__()
        self.t = t


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def answered(i: int, status: str = "ok", attempt: int = 1) -> RequestRecord:
    return RequestRecord(i, attempt, "short", float(i), 0.0, status, 10, 10,
                         ttft_s=0.1 if status == "ok" else None)


def progress_at(states: dict[str, str], stream: io.StringIO | None = None
                ) -> tuple[Progress, Clock]:
    clock = Clock()
    return Progress(stream or io.StringIO(), clock, 3600.0, RequestTable(), lambda: 0.5,
                    lambda: states), clock


def test_the_rate_is_answers_a_second_over_the_last_minute() -> None:
    progress, clock = progress_at({})
    for i in range(30):  # 30 answers over the first 30 s
        clock.t = float(i)
        progress.add(answered(i))
    progress.add(answered(99, status="timeout"))  # not an answer
    progress.add(answered(98, attempt=2))  # a retry is not a first answer
    clock.t = 30.0
    assert progress.rate(clock.t) == pytest.approx(1.0)  # since the load began, 30 s ago
    clock.t = 89.0  # the minute before now holds the answer at 29 s alone
    assert progress.rate(clock.t) == pytest.approx(1 / RECENT_S)
    clock.t = 200.0
    assert progress.rate(clock.t) == 0.0
    assert "0.00 req/s" in progress.line()


def test_no_rate_before_the_load_began() -> None:
    progress, clock = progress_at({})
    progress.load_start = 10.0
    clock.t = 10.0
    assert progress.rate(clock.t) == 0.0


def test_the_states_are_shown_as_given_provisional_or_certain() -> None:
    progress, _ = progress_at({"GPU": "-", "KV": "LEAK", "latency": "fail?", "STALL": ""})
    progress._states = progress.criteria()
    assert progress.line().endswith(" | KV 50% | GPU - KV LEAK latency fail? STALL")


def test_stopping_early_is_a_line_of_its_own() -> None:
    plain = io.StringIO()
    progress, _ = progress_at({}, plain)
    progress.say("stopping early: m 0: STALLED (no token generated for 12 s)")
    assert plain.getvalue() == "stopping early: m 0: STALLED (no token generated for 12 s)\n"
    terminal = Terminal()
    progress, _ = progress_at({}, terminal)
    progress.say("stopping early")
    assert terminal.getvalue().endswith("stopping early\x1b[K\n")


def test_after_the_load_the_line_says_what_the_run_waits_for() -> None:
    clock = FixedClock(3600.0)
    progress = Progress(io.StringIO(), clock, 3600.0, None, lambda: 0.5, dict)
    assert progress.line().startswith("1:00:00 / 1:00:00 | KV 50%")
    in_flight = [8]
    progress.drain(3600.0 + 70.0, lambda: in_flight[0])
    assert progress.line().startswith(
        "load done (1:00:00); draining 8 in flight, 0:01:10 at most | KV 50%")
    clock.t, in_flight[0] = 3650.0, 3
    assert progress.line().startswith("load done (1:00:00); draining 3 in flight, 0:00:20 at most")
    clock.t = 3700.0  # past the deadline: never a negative wait
    assert "0:00:00 at most" in progress.line()
    progress.settle()
    assert progress.line().startswith(
        "load done; waiting for the server to go idle for the last reading | KV 50%")


def test_the_line_in_full_and_its_blanks() -> None:
    table = RequestTable()
    for i, status in enumerate(("ok", "ok", "error", "timeout", "dropped", "dropped", "cut")):
        table.add(answered(i, status))
    clock = FixedClock(100.0)
    progress = Progress(io.StringIO(), clock, 3600.0, table, lambda: None, dict)
    progress.load_start = 40.0  # 60 s of load so far
    assert progress.line() == ("0:01:00 / 1:00:00 | 2 done, 2 failed, 2 dropped, 0.00 req/s"
                               " | TTFT p50 - p99 - | KV -")  # no answers, no usage, no states


def test_recent_answers_are_the_last_minute_exactly() -> None:
    progress, clock = progress_at({})
    for t, ttft in ((10.0, 0.9), (40.0, 1.0), (50.0, 1.5)):
        clock.t = t
        progress.add(RequestRecord(0, 1, "short", t, 0.0, "ok", 10, 10, ttft_s=ttft))
    clock.t = 55.0
    progress.add(RequestRecord(1, 1, "short", 55.0, 0.0, "ok", 10, 10, ttft_s=None))
    clock.t = 70.0  # the answer at 10 s is exactly a minute old: still recent
    assert progress.line() == ("0:01:10 / 1:00:00 | 0 done, 0 failed, 0 dropped, 0.07 req/s"
                               " | TTFT p50 1.0s p99 1.5s | KV 50%")
    clock.t = 70.5  # now it is not; the answer without a TTFT counts in the rate alone
    assert progress.line() == ("0:01:10 / 1:00:00 | 0 done, 0 failed, 0 dropped, 0.05 req/s"
                               " | TTFT p50 1.2s p99 1.5s | KV 50%")
    clock.t = 109.0
    assert " | TTFT p50 1.5s p99 1.5s | " in progress.line()


def test_milliseconds_below_a_second() -> None:
    progress, _ = progress_at({})
    progress.add(RequestRecord(0, 1, "short", 0.0, 0.0, "ok", 10, 10, ttft_s=0.9))
    assert " | TTFT p50 900ms p99 900ms | " in progress.line()


def test_the_rate_counts_from_the_load_start_for_its_first_minute() -> None:
    progress, clock = progress_at({})
    progress.load_start = 100.0
    for t in (100.2, 100.4):
        clock.t = t
        progress.add(answered(0))
    assert progress.rate(100.5) == pytest.approx(4.0)  # 2 answers in half a second
    assert progress.rate(120.0) == pytest.approx(0.1)  # 2 in 20 s


class Ticks:
    """asyncio.sleep for ``Progress.run``: records each wait and ends the run after ``n``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        if len(self.waits) == self.n:
            raise asyncio.CancelledError
        self.waits.append(seconds)


def counted() -> Callable[[], dict[str, str]]:
    calls = [0]

    def criteria() -> dict[str, str]:
        calls[0] += 1
        return {"judged": str(calls[0])}
    return criteria


def run_for(stream: io.StringIO, updates: int, monkeypatch: pytest.MonkeyPatch) -> Ticks:
    ticks = Ticks(updates)
    monkeypatch.setattr(asyncio, "sleep", ticks)
    progress = Progress(stream, FixedClock(0.0), 60.0, None, lambda: 0.5, counted())
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(progress.run())
    return ticks


def test_a_terminal_gets_one_line_a_second_and_the_states_every_ten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    ticks = run_for(terminal, 21, monkeypatch)
    assert ticks.waits == [1.0] * 21
    line = "\r0:00:00 / 0:01:00 | KV 50% | judged {}\x1b[K"
    assert terminal.getvalue() == (line.format(1) * 10 + line.format(2) * 10 + line.format(3)
                                   + "\n")  # the line ends when the run does


def test_a_log_gets_a_line_a_minute_with_fresh_states(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = io.StringIO()
    ticks = run_for(plain, 3, monkeypatch)
    assert ticks.waits == [60.0] * 3
    assert plain.getvalue() == "".join(f"0:00:00 / 0:01:00 | KV 50% | judged {n}\n"
                                       for n in (1, 2, 3))
