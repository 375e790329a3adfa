"""The load driver's promises: never over the rate or the concurrency, stop when told,
retries apart, every attempt logged."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from pathlib import Path

import pytest

from kvtop.load.driver import DriverCounts, DriverSettings, LoadDriver, RequestRecord, RunClock
from kvtop.load.openai_client import make_session
from kvtop.load.prompts import PromptMaker
from kvtop.load.workloads import Workload, make_workload
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


async def run_until(url: str, settings: DriverSettings, count: int, *,
                    workload: Workload | None = None, clock: RunClock | None = None,
                    grace_s: float = 5.0, limit_s: float = 10.0
                    ) -> tuple[LoadDriver, list[RequestRecord]]:
    """Drive until ``count`` attempts are logged (or ``limit_s`` passes)."""
    records: list[RequestRecord] = []
    stop = asyncio.Event()

    def keep(record: RequestRecord) -> None:
        records.append(record)
        if len(records) >= count:
            stop.set()

    async with make_session() as session:
        driver = LoadDriver(settings, workload or make_workload("mixed", model_len=2048),
                            session, clock or RunClock(), keep, token="s3cret-token")
        asyncio.get_running_loop().call_later(limit_s, stop.set)
        await driver.run(stop)
        await driver.finish(grace_s)
    return driver, records


def outcome(record: RequestRecord) -> tuple[object, ...]:
    return (record.id, record.attempt, record.status, record.http_status, record.error)


async def test_a_closed_loop_sends_the_workloads_plans_in_order_with_its_prompts() -> None:
    plans = list(itertools.islice(make_workload("mixed", model_len=2048), 3))
    maker = PromptMaker(seed=5)
    before = time.time()
    async with FakeOpenAI(tokens=2) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=1, seed=5)
        driver, records = await run_until(server.url, settings, 3)
    assert [outcome(r) for r in records] == [(n, 1, "ok", 200, None) for n in (1, 2, 3)]
    assert [(r.cls, r.planned_prompt_tokens, r.max_tokens) for r in records] == [
        (p.cls, p.prompt_tokens, p.max_tokens) for p in plans]
    assert [(r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in records] == [
        (3, 2, "length")] * 3
    assert server.bodies == [
        {"model": MODEL, "max_tokens": p.max_tokens, "stream": True,
         "stream_options": {"include_usage": True, "continuous_usage_stats": True},
         "ignore_eos": True, "prompt": maker.make(p.prompt_tokens, p.shared)} for p in plans]
    assert server.paths == ["/v1/completions"] * 3
    assert server.authorizations == ["Bearer s3cret-token"] * 3
    assert driver.counts == DriverCounts(sent=3, dropped=0, retries=0, in_flight=0,
                                         max_in_flight=1, by_status={"ok": 3})
    for record in records:
        assert before <= record.time <= time.time()
        assert record.ttft_s is not None and record.total_s is not None
        assert record.queued_s is not None and 0.0 < record.queued_s < 0.5
        assert 0.0 <= record.t < 5.0 and record.tpot_s is not None
        assert record.itl_max_s is not None and record.retryable is False


async def test_chat_token_ids_and_eos_are_asked_as_set() -> None:
    async with FakeOpenAI(tokens=1) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=1, chat=True,
                                  ignore_eos=False)
        await run_until(server.url, settings, 1)
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=1, token_ids=True)
        await run_until(server.url, settings, 1)
    chat, ids = server.bodies
    assert server.paths == ["/v1/chat/completions", "/v1/completions"]
    assert "ignore_eos" not in chat and isinstance(chat["messages"], list)
    assert ids["ignore_eos"] is True and isinstance(ids["prompt"], list)
    plan = next(make_workload("mixed", model_len=2048))
    assert ids["prompt"] == PromptMaker(token_ids=True).make(plan.prompt_tokens, plan.shared)


@pytest.mark.parametrize(("retries", "outcomes"), [
    (1, [(1, 1, "error", 503, "HTTP 503: refused 1"), (1, 2, "error", 503, "HTTP 503: refused 2"),
         (2, 1, "ok", 200, None), (3, 1, "error", 400, "HTTP 400: refused 4"),
         (4, 1, "ok", 200, None)]),
    (2, [(1, 1, "error", 503, "HTTP 503: refused 1"), (1, 2, "error", 503, "HTTP 503: refused 2"),
         (1, 3, "ok", 200, None), (2, 1, "ok", 200, None),
         (3, 1, "error", 400, "HTTP 400: refused 5")]),
    (0, [(1, 1, "error", 503, "HTTP 503: refused 1"), (2, 1, "error", 503, "HTTP 503: refused 2"),
         (3, 1, "ok", 200, None), (4, 1, "error", 400, "HTTP 400: refused 4"),
         (5, 1, "ok", 200, None)]),
])
async def test_a_closed_loop_retries_what_may_be_retried_as_often_as_set(
        retries: int, outcomes: list[tuple[object, ...]]) -> None:
    failing = {1: 503, 2: 503, 4: 400} if retries != 2 else {1: 503, 2: 503, 5: 400}
    async with FakeOpenAI(tokens=1, fail_status=failing) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=1, retries=retries,
                                  retry_after_s=0.05)
        driver, records = await run_until(server.url, settings, 5)
    assert [outcome(r) for r in records] == outcomes
    assert driver.counts.retries == sum(r.attempt > 1 for r in records) == retries
    assert driver.counts.sent == 5
    if retries:  # a retry waits its time
        assert server.arrivals[1] - server.arrivals[0] >= 0.05


async def test_in_an_open_loop_a_retry_takes_the_place_of_the_arrival_it_is_due_at() -> None:
    async with FakeOpenAI(tokens=1, fail_status={1: 503}) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, rate=10.0, concurrency=8,
                                  retry_after_s=0.25)
        driver, records = await run_until(server.url, settings, 5)
    assert [outcome(r) for r in records] == [
        (1, 1, "error", 503, "HTTP 503: refused 1"), (2, 1, "ok", 200, None),
        (3, 1, "ok", 200, None), (1, 2, "ok", 200, None), (4, 1, "ok", 200, None)]
    first, retry, fourth = records[0], records[3], records[4]
    plans = list(itertools.islice(make_workload("mixed", model_len=2048), 4))
    assert [(r.cls, r.planned_prompt_tokens, r.max_tokens) for r in records if r.attempt == 1] \
        == [(p.cls, p.prompt_tokens, p.max_tokens) for p in plans]
    assert first.t < 0.08  # the first arrival is at the start
    # due 0.25 s after the answer, it went at the fourth arrival (0.3 s), id 4 at the fifth
    assert 0.3 <= retry.t - first.t < 0.4
    assert fourth.t - first.t == pytest.approx(0.4)
    assert [r.t - first.t for r in records[1:3]] == pytest.approx([0.1, 0.2])
    assert driver.counts.retries == 1 and driver.counts.sent == 5


async def test_an_open_loop_keeps_only_the_requests_in_flight() -> None:
    async with FakeOpenAI(tokens=1) as server, make_session() as session:
        settings = DriverSettings(server.url + "/v1", MODEL, rate=50.0)
        records: list[RequestRecord] = []
        driver = LoadDriver(settings, make_workload("mixed", model_len=2048), session,
                            RunClock(), records.append)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.4, stop.set)
        await driver.run(stop)
        await asyncio.sleep(0.2)  # every answer in
        # a long run's finished requests are not kept until its end
        assert len(records) >= 10 and driver._tasks == set()
        await driver.finish(1.0)


async def test_an_open_loop_sends_nothing_once_stopped() -> None:
    async with FakeOpenAI(tokens=1) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, rate=4.0)
        _, records = await drive(server.url, settings, seconds=0.4)
        await asyncio.sleep(0.3)
    assert len(server.arrivals) == len(records) == 2  # at 0 and 0.25 s; not the one at 0.5


async def test_a_trace_sends_at_its_own_times_and_a_retry_adds_to_them(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{t:010.7f},10,1\n" for t in (0.0, 0.15, 0.3)), encoding="utf-8")
    async with FakeOpenAI(tokens=1, fail_status={1: 503}) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=8, retry_after_s=0.01)
        _, records = await run_until(
            server.url, settings, 4, workload=make_workload(f"trace:{trace}", model_len=100))
    first = records[0]
    assert sorted(outcome(r) for r in records) == [
        (1, 1, "error", 503, "HTTP 503: refused 1"), (1, 2, "ok", 200, None),
        (2, 1, "ok", 200, None), (3, 1, "ok", 200, None)]
    planned = {r.id: r.t - first.t for r in records if r.attempt == 1}
    assert planned == pytest.approx({1: 0.0, 2: 0.15, 3: 0.3})
    # each sent when planned: waiting is from the planned time, not from the start
    assert all(r.queued_s is not None and r.queued_s < 0.25 for r in records)


async def test_an_arrival_that_finds_the_concurrency_in_flight_is_dropped() -> None:
    before = time.time()
    async with FakeOpenAI(tokens=20, token_gap_s=0.05) as server:  # 1 s per answer
        settings = DriverSettings(server.url + "/v1", MODEL, rate=20.0, concurrency=2)
        driver, records = await run_until(server.url, settings, 2, grace_s=0.0)
    plans = list(itertools.islice(make_workload("mixed", model_len=2048), 4))
    assert [(r.id, r.status) for r in records[:2]] == [(3, "dropped"), (4, "dropped")]
    dropped = records[0]
    assert dropped == RequestRecord(3, 1, plans[2].cls, dropped.t, dropped.time, "dropped",
                                    plans[2].prompt_tokens, plans[2].max_tokens)
    assert dropped.retryable is False and dropped.completion_tokens is None
    # logged at their planned arrivals (0.1 and 0.15 s), stamped when dropped
    assert 0.1 <= dropped.t < 0.2 and records[1].t - dropped.t == pytest.approx(0.05)
    assert before <= dropped.time <= records[1].time <= time.time()
    assert sorted((r.id, r.status) for r in records[2:]) == [(1, "cut"), (2, "cut")]
    assert driver.counts == DriverCounts(sent=2, dropped=2, retries=0, in_flight=0,
                                         max_in_flight=2, by_status={"dropped": 2, "cut": 2})
    assert server.max_in_flight == 2


@pytest.mark.parametrize(("scale", "grace_s", "statuses"), [
    (1.0, 3.0, ["ok", "ok"]),  # 3 s of grace: both answers end
    (0.25, 1.0, ["ok", "ok"]),  # 1 target second at 0.25x is 4 wall seconds: enough
    (10.0, 3.0, ["cut", "cut"]),  # 3 target seconds at 10x are 0.3 wall seconds: too short
])
async def test_the_end_waits_its_grace_in_target_time_then_cuts(
        scale: float, grace_s: float, statuses: list[str]) -> None:
    async with FakeOpenAI(tokens=4, token_gap_s=0.2) as server:  # 0.8 s per answer
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=2)
        records: list[RequestRecord] = []
        clock = RunClock(scale)
        await asyncio.sleep(0.2)  # the run starts late in its clock's time
        async with make_session() as session:
            driver = LoadDriver(settings, make_workload("mixed", model_len=2048), session,
                                clock, records.append)
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(0.1, stop.set)
            await driver.run(stop)
            await driver.finish(grace_s)
            # logged by the time finish returns, cut ones too
            assert [r.status for r in records] == statuses
            assert driver.counts.in_flight == 0
    # cut after 0.1 s running and 0.3 s of grace: 4 target seconds from its sending (at 2)
    cut = [r for r in records if r.status == "cut"]
    assert all(r.total_s is not None and 3.0 < r.total_s < 6.0 for r in cut)
    assert all(r.completion_tokens is not None and r.completion_tokens < 4 for r in cut)


async def test_a_request_times_out_in_target_time() -> None:
    async with FakeOpenAI(hang=True) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=1,
                                  request_timeout_s=3.0)
        started = time.perf_counter()
        _, records = await run_until(server.url, settings, 1, clock=RunClock(10.0))
        took = time.perf_counter() - started
    (record,) = records
    assert (record.status, record.error) == ("timeout", "no complete answer in time")
    assert record.total_s is not None and 3.0 <= record.total_s < 10.0  # target seconds
    assert took < 2.0  # 0.3 wall seconds, not 3


async def test_the_run_clock_counts_target_seconds() -> None:
    clock = RunClock(10.0)
    assert clock.wall(5.0) == 0.5
    assert clock.since_start(clock.unix0 + 2.0) == 20.0
    assert RunClock().wall(5.0) == 5.0 and RunClock().scale == 1.0
    begun = clock.now()
    await asyncio.sleep(0.05)
    assert clock.now() - begun >= 0.5
    started = time.perf_counter()
    await clock.sleep_until(clock.now() + 1.0)  # 0.1 wall seconds
    assert time.perf_counter() - started >= 0.1
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)
    started = time.perf_counter()
    await clock.sleep_until(clock.now() + 100.0, stop)  # 10 wall seconds, or the stop
    assert time.perf_counter() - started < 5.0
    started = time.perf_counter()
    await clock.sleep_until(clock.now() + 1.0, asyncio.Event())  # no stop: its time
    assert time.perf_counter() - started >= 0.1
    await clock.sleep_until(0.0)  # past: at once


def test_a_log_line_rounds_to_microseconds_and_keeps_no_driver_state() -> None:
    record = RequestRecord(7, 2, "short", 1.23456789, 1700000000.123456789, "ok", 100, 20,
                           http_status=200, prompt_tokens=100, completion_tokens=20,
                           ttft_s=0.0000004, tpot_s=0.0100000049, itl_max_s=0.5,
                           total_s=2.0, queued_s=0.0, finish_reason="length", retryable=True)
    assert record.to_json() == {
        "id": 7, "attempt": 2, "cls": "short", "t": 1.234568, "time": 1700000000.123457,
        "status": "ok", "planned_prompt_tokens": 100, "max_tokens": 20, "http_status": 200,
        "error": None, "prompt_tokens": 100, "completion_tokens": 20, "ttft_s": 0.0,
        "tpot_s": 0.01, "itl_max_s": 0.5, "total_s": 2.0, "queued_s": 0.0,
        "finish_reason": "length"}


def test_a_driver_that_sent_nothing_counts_nothing() -> None:
    assert DriverCounts() == DriverCounts(sent=0, dropped=0, retries=0, in_flight=0,
                                          max_in_flight=0, by_status={})


def test_the_settings_default_to_the_documented_values() -> None:
    assert DriverSettings("http://a/v1", "m") == DriverSettings(
        "http://a/v1", "m", rate=None, concurrency=8, request_timeout_s=300.0, retries=1,
        retry_after_s=1.0, chat=False, token_ids=False, ignore_eos=True, seed=0)


async def test_a_retry_waiting_when_the_run_stops_is_never_sent() -> None:
    async with FakeOpenAI(tokens=1, fail_status={1: 503}) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=1, retry_after_s=5.0)
        started = time.perf_counter()
        _, records = await drive(server.url, settings, seconds=0.3)
        took = time.perf_counter() - started
        await asyncio.sleep(0.1)
    assert [outcome(r) for r in records] == [(1, 1, "error", 503, "HTTP 503: refused 1")]
    assert len(server.arrivals) == 1
    assert took < 2.0  # the stop ended the wait (of 5 s): nothing was left to finish


async def test_an_open_loop_stops_between_arrivals() -> None:
    async with FakeOpenAI(tokens=1) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, rate=0.5)  # 2 s apart
        started = time.perf_counter()
        _, records = await drive(server.url, settings, seconds=0.3)
        took = time.perf_counter() - started
    assert len(records) == 1 and took < 1.5  # not at the next arrival, 2 s on


async def test_a_trace_arrival_takes_one_due_retry_the_next_waits_for_the_next_arrival(
        tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{t:010.7f},10,1\n" for t in (0.0, 0.01, 0.5)), encoding="utf-8")
    async with FakeOpenAI(tokens=1, fail_status={1: 503, 2: 503}) as server:
        settings = DriverSettings(server.url + "/v1", MODEL, concurrency=8, retry_after_s=0.05)
        _, records = await run_until(
            server.url, settings, 6, workload=make_workload(f"trace:{trace}", model_len=100))
    at = {(r.id, r.attempt): r.t for r in records}
    at = {key: t - at[1, 1] for key, t in at.items()}
    assert {key: at[key] for key in ((1, 1), (2, 1), (3, 1), (4, 1))} == pytest.approx(
        {(1, 1): 0.0, (2, 1): 0.01, (3, 1): 0.5, (4, 1): 4 / 3})
    # a retry's time is its sending: one at the 0.5 s arrival; the other waited for the
    # next, a lap (1 s) and a mean gap (1/3 s) from the start
    assert 0.5 <= at[1, 2] < 0.6 and 4 / 3 <= at[2, 2] < 4 / 3 + 0.1
