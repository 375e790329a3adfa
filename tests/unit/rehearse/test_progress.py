"""The rehearsal's progress line: the rate achieved, the criteria's states as provisional
until judged, what is certain already (a confirmed LEAK, a STALL), a line of its own for
stopping early, and after the load what it waits for (draining, then the server going idle):
it never stands still without saying why."""

from __future__ import annotations

import io

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
