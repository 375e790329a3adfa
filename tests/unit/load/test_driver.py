"""The load driver's promises: never over the rate or the concurrency, stop when told,
retries apart, every attempt logged."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import Counter

import pytest

from kvtop.load.driver import DriverSettings, LoadDriver, RequestRecord, RunClock
from kvtop.load.openai_client import make_session
from kvtop.load.workloads import make_workload
from kvtop.sim.server import SimConfig, SimFleet
from tests.fakes.fake_openai import MODEL, FakeOpenAI


async def drive(url: str, settings: DriverSettings, *, seconds: float, grace_s: float = 5.0,
                workload: str = "mixed", scale: float = 1.0, model_len: int = 2048
                ) -> tuple[LoadDriver, list[RequestRecord]]:
    records: list[RequestRecord] = []
    async with make_session(limit=settings.concurrency) as session:
        driver = LoadDriver(settings, make_workload(workload, model_len=model_len), session,
                            RunClock(scale), records.append)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        await driver.run(stop)
        await driver.finish(grace_s)
    return driver, records


def most_in_any_window(times: list[float], window: float) -> int:
    times = sorted(times)
    most, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window:
            start += 1
        most = max(most, end - start + 1)
    return most


async def test_an_open_loop_keeps_to_its_rate() -> None:
    async with FakeOpenAI(tokens=2) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, rate=20.0, concurrency=50)
        driver, records = await drive(server.url, settings, seconds=1.5)
    sent = len(server.arrivals)
    assert sent == driver.counts.sent == len(records)
    # evenly spaced 50 ms apart: 1.5 s holds at most 31 arrivals, any 0.5 s at most 11
    assert sent <= math.floor(1.5 * 20) + 1
    assert most_in_any_window(server.arrivals, 0.5) <= 0.5 * 20 + 1
    assert all(r.status == "ok" and r.attempt == 1 for r in records)
    planned = sorted(r.t for r in records)
    assert [b - a for a, b in itertools.pairwise(planned[:5])] == pytest.approx([0.05] * 4)


async def test_arrivals_over_the_concurrency_are_dropped_not_queued() -> None:
    async with FakeOpenAI(tokens=50, token_gap_s=0.05) as server:  # 2.5 s per answer
        settings = DriverSettings(server.url + "/v1", MODEL, rate=20.0, concurrency=3)
        driver, records = await drive(server.url, settings, seconds=1.0, grace_s=0.0)
    assert server.max_in_flight == 3 == driver.counts.max_in_flight
    statuses = Counter(r.status for r in records)
    assert statuses["dropped"] >= 10 and statuses["cut"] == 3
    assert len(server.arrivals) == 3  # dropped arrivals never reached the server


async def test_a_closed_loop_holds_its_concurrency_and_stops() -> None:
    async with FakeOpenAI(tokens=3, token_gap_s=0.02) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=4)
        _, records = await drive(server.url, settings, seconds=1.0)
        after = len(server.arrivals)
        await asyncio.sleep(0.2)
        assert len(server.arrivals) == after  # nothing is sent once stopped
    assert server.max_in_flight == 4
    assert len(records) == after >= 8
    assert Counter(r.status for r in records) == {"ok": len(records)}


async def test_retries_are_logged_apart_and_take_an_arrivals_place() -> None:
    # the retries are due 0.3 s on, long after request 3 (id 3, at 0.1 s) was sent: at 0.1 s
    # a retry could take its place, be the server's third request and meet its 400
    async with FakeOpenAI(tokens=1, fail_status={1: 503, 2: 503, 3: 400}) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, rate=20.0, concurrency=20,
                                  retries=1, retry_after_s=0.3)
        _, records = await drive(server.url, settings, seconds=1.0)
    first = [r for r in records if r.attempt == 1]
    again = [r for r in records if r.attempt == 2]
    assert {r.id for r in again} == {1, 2}  # 503 is retried, 400 is not
    assert all(r.status == "ok" for r in again)
    assert [r.status for r in first[:3]] == ["error", "error", "error"]
    assert first[0].error == "HTTP 503: refused 1"
    assert len(server.arrivals) <= math.floor(1.0 * 20) + 1  # retries within the rate


async def test_a_hung_server_times_out_and_the_end_cuts_what_is_left() -> None:
    async with FakeOpenAI(hang=True) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=2,
                                  request_timeout_s=0.2)
        _, records = await drive(server.url, settings, seconds=0.5, grace_s=0.0)
    statuses = Counter(r.status for r in records)
    assert statuses["timeout"] >= 2 and statuses["cut"] == 2
    assert all(r.total_s is not None for r in records if r.status == "timeout")


async def test_accelerated_time_and_the_log_lines() -> None:
    """At time scale 10 a 2 s run takes 0.2 s, at 10 requests per target second."""
    async with SimFleet([SimConfig(workload="none", speed=10.0)]) as fleet:
        model = fleet.servers[0].config.model_name
        settings = DriverSettings(fleet.urls[0] + "/v1", model, rate=10.0, concurrency=64)
        _, records = await drive(fleet.urls[0], settings, seconds=0.2, scale=10.0,
                                 grace_s=60.0)
    assert 15 <= len(records) <= 21
    line = records[0].to_json()
    assert set(line) == {"id", "attempt", "cls", "t", "time", "status",
                         "planned_prompt_tokens", "max_tokens", "http_status", "error",
                         "prompt_tokens", "completion_tokens", "ttft_s", "tpot_s",
                         "itl_max_s", "total_s", "queued_s", "finish_reason"}
    answered = [r for r in records if r.status == "ok"]
    assert answered and all(r.prompt_tokens == r.planned_prompt_tokens for r in answered)
    assert all(r.completion_tokens == r.max_tokens for r in answered)
