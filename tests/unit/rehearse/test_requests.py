"""The requests a rehearsal sent: first attempts in columns (the judge's input), retries
counted apart, the error messages of first attempts (cut to 120 characters) and the tokens
of every answered attempt, as the server's own counters count them."""

from __future__ import annotations

import math
from array import array
from typing import Any

from kvtop.load.driver import Outcome, RequestRecord
from kvtop.rehearse.requests import RequestTable


def attempt(id: int, status: Outcome, cls: str = "short", attempt: int = 1,
            **timings: Any) -> RequestRecord:
    return RequestRecord(id, attempt, cls, float(id), 1796129573.0 + id, status, 100 + id, 20,
                         **timings)


def cells(column: array) -> list[float | None]:
    """A float column with its blanks (NaN) as None, so lists compare."""
    return [None if math.isnan(v) else v for v in column]


def run_table() -> RequestTable:
    table = RequestTable()
    for record in (
            attempt(0, "ok", prompt_tokens=100, completion_tokens=20, ttft_s=0.1, tpot_s=0.01,
                    total_s=0.5),
            attempt(1, "error", "long", error="HTTP 500: " + "x" * 200),
            attempt(2, "timeout", total_s=300.0),
            attempt(3, "dropped"),
            attempt(4, "cut", "long"),
            attempt(1, "ok", "long", attempt=2, prompt_tokens=2000, completion_tokens=10),
            attempt(2, "error", attempt=2, error="HTTP 503"),
            attempt(5, "ok", prompt_tokens=None, completion_tokens=None, ttft_s=2.0),
            attempt(6, "error", "tiny", error=""),
            attempt(7, "error", "long", error="HTTP 500: " + "x" * 200),
            attempt(6, "timeout", "tiny", attempt=2),
            attempt(6, "error", "tiny", attempt=3, error="HTTP 503")):
        table.add(record)
    return table


def test_first_attempts_in_columns() -> None:
    table = run_table()
    assert len(table) == 8
    assert list(table.t) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert table.classes == ["short", "long", "tiny"]
    assert list(table.cls) == [0, 1, 0, 0, 1, 0, 2, 1]
    assert list(table.outcome) == [0, 1, 2, 3, 4, 0, 1, 1]  # ok error timeout dropped cut
    assert cells(table.ttft) == [0.1, None, None, None, None, 2.0, None, None]
    assert cells(table.tpot) == [0.01, None, None, None, None, None, None, None]
    assert cells(table.total) == [0.5, None, 300.0, None, None, None, None, None]
    # the tokens the server counted, else the planned ones
    assert list(table.prompt) == [100, 101, 102, 103, 104, 105, 106, 107]
    assert (table.t.typecode, table.cls.typecode, table.outcome.typecode, table.ttft.typecode,
            table.tpot.typecode, table.total.typecode, table.prompt.typecode) == \
        ("d", "B", "B", "d", "d", "d", "l")


def test_outcomes_retries_errors_and_tokens_are_counted() -> None:
    table = run_table()
    assert dict(table.statuses) == {"ok": 2, "error": 3, "timeout": 1, "dropped": 1, "cut": 1}
    assert dict(table.retries) == {"ok": 1, "error": 2, "timeout": 1}
    assert dict(table.errors) == {"HTTP 500: " + "x" * 110: 2, "timeout": 1, "error": 1}
    assert (table.answered, table.prompt_tokens, table.completion_tokens) == (3, 2100, 30)
    assert (table.failed, table.sent) == (4, 6)
    assert table.error_rate() == 4 / 6


def test_a_server_counted_prompt_wins_over_the_planned_one() -> None:
    table = RequestTable()
    table.add(attempt(9, "ok", prompt_tokens=0, completion_tokens=0))  # counted, and 0
    assert list(table.prompt) == [0]
    assert (table.answered, table.prompt_tokens, table.completion_tokens) == (1, 0, 0)


def test_no_error_rate_before_a_request_reached_the_wire() -> None:
    table = RequestTable()
    assert table.error_rate() is None
    table.add(attempt(0, "dropped"))
    table.add(attempt(1, "cut"))
    assert (len(table), table.sent, table.error_rate()) == (2, 0, None)
    table.add(attempt(2, "ok"))
    assert table.error_rate() == 0.0
