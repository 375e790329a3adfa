"""Reading the fleet through a Prometheus, as the app and ``kvtop check --prometheus`` rely on
it (docs/prometheus.md), from a fake Prometheus API on 127.0.0.1 that stores scrapes with
their timestamps and answers kvtop's queries over them: which instances are found, one
scrape per instance and timestamp in time order, each stored sample read once, a down
instance with Prometheus's own reason, a stale one named so, the backfill's span and step,
and Prometheus's refusals (a token, its errors) said plainly with the token masked.

Successive refreshes through Prometheus read every stored sample once, late ones too.

A fake API answers the range queries as Prometheus does (samples with timestamps in
(at − range, at], visible only once they have landed), over a clock the test moves."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import re
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import pytest

from kvtop.collect.adapters import adapt, read_exposition
from kvtop.collect.exposition import Exposition, to_text
from kvtop.collect.prometheus import (
    DEFAULT_BACKFILL_STEP_S,
    INGEST_LAG_S,
    MAX_ANSWER_BYTES,
    MAX_CACHED_HEAD_CHARS,
    MAX_CACHED_HEADS,
    MAX_POINTS,
    OFF_LOOP_BYTES,
    OFF_LOOP_SERIES,
    PROMETHEUS_INTERVAL_S,
    TARGETS_CACHE_S,
    PrometheusError,
    PrometheusSource,
    group_scrapes,
    load_settings,
    parse_retention,
    selector_matchers,
    target_for,
    vector_selector,
)
from kvtop.collect.prometheus import source as prometheus_source
from kvtop.collect.prometheus.answers import _heads
from kvtop.collect.target import Scrape, Secret
from kvtop.safe_text import MIN_KNOWN_SECRET
from tests.fakes.faultserver import FaultServer, Request, mode
from tests.support.paths import REPO
from tests.support.waiting import eventually

T0 = 1_767_225_600.0


JOB = "vllm"


A, B = "10.0.0.1:8000", "10.0.0.2:8000"


RUNNING = "vllm:num_requests_running"


@dataclass
class Stored:
    """What a Prometheus holds: per (job, instance), scrapes (t, running) and `up` samples;
    and how it answers (an error status and body instead, while set)."""

    scrapes: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    up: dict[tuple[str, str], list[tuple[float, str]]] = field(default_factory=dict)
    last_error: dict[tuple[str, str], str] = field(default_factory=dict)
    retention: object = "15d"
    targets_answer: object = None  # /api/v1/targets' data instead of the real one, when set
    runtime_answer: object = None  # likewise for status/runtimeinfo
    refuse: tuple[int, bytes] | None = None
    hostile: dict[str, bytes] = field(default_factory=dict)  # kind -> the raw answer sent
    queries: list[dict[str, str]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def respond(self, request: Request) -> tuple[int, bytes]:
        self.headers.append(request.headers)
        if self.refuse is not None:
            return self.refuse
        form = {k: v[-1] for k, v in parse_qs(request.body.decode()).items()}
        self.queries.append({"path": request.path, **form})
        path = request.path.rpartition("/api/v1/")[2]
        if path not in API_PATHS:
            return 404, b"404 page not found"
        if request.method != ("POST" if path.startswith("query") else "GET"):
            return 405, b"Method Not Allowed"  # kvtop POSTs queries, GETs the rest
        if request.path.endswith("/status/runtimeinfo"):
            if self.runtime_answer is not None:
                return ok(self.runtime_answer)
            return ok({"storageRetention": self.retention})
        if request.path.endswith("/targets"):
            if self.targets_answer is not None:
                return ok(self.targets_answer)
            return ok({"activeTargets": [
                {"labels": labels(job=job, instance=instance), "lastError": error}
                for (job, instance), error in self.last_error.items()]})
        query = form["query"]
        kind = ("range" if request.path.endswith("/query_range") else "discover"
                if query.startswith("count by") else "up" if query.startswith("up")
                else "refresh")
        if kind in self.hostile:
            return 200, self.hostile[kind]
        if request.path.endswith("/query_range"):
            start, end = float(form["start"]), float(form["end"])
            if (end - start) // float(form["step"]) > 11_000:  # as Prometheus refuses it
                return 400, json.dumps({"status": "error", "errorType": "bad_data", "error": (
                    "exceeded maximum resolution of 11,000 points per timeseries. Try "
                    "decreasing the query resolution (?step=XX)")}).encode()
            return self._matrix(start - 0.001, end, query)
        at = float(form["time"])
        if query.startswith("count by"):
            return ok({"resultType": "vector", "result": [
                {"metric": labels(job=job, instance=instance), "value": [at, "1"]}
                for job, instance in self.scrapes]})
        span = int(re.search(r"\[(\d+)ms\]", query).group(1)) / 1000  # type: ignore[union-attr]
        if query.startswith("up"):
            jobs = job_regex(query)
            if jobs is None:
                return 400, json.dumps({"status": "error", "errorType": "bad_data",
                                        "error": "unknown escape sequence"}).encode()
            return ok({"resultType": "matrix", "result": [
                {"metric": labels(__name__="up", job=job, instance=instance),
                 "values": [[t, v] for t, v in samples if at - span < t <= at]}
                for (job, instance), samples in self.up.items() if re.fullmatch(jobs, job)]})
        return self._matrix(at - span, at, query)

    def _matrix(self, after: float, until: float, query: str) -> tuple[int, bytes]:
        assert RUNNING in query
        return ok({"resultType": "matrix", "result": [
            {"metric": labels(__name__=RUNNING, job=job, instance=instance, model_name="m",
                              engine="0"),
             "values": [[t, repr(v)] for t, v in samples if after < t <= until]}
            for (job, instance), samples in self.scrapes.items()]})


API_PATHS = ("query", "query_range", "status/runtimeinfo", "targets")


GO_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b",
              "f": "\f", "v": "\v"}


def job_regex(query: str) -> str | None:
    """The regex of a query's ``job=~"..."`` matcher as PromQL reads the string (Go's
    escapes), or None for an escape PromQL refuses."""
    written = re.search(r'job=~"((?:[^"\\]|\\.)*)"', query, re.DOTALL)
    assert written is not None, query
    text, out, i = written.group(1), [], 0
    while i < len(text):
        char = text[i]
        if char == "\n":
            return None  # a raw newline ends nothing: PromQL refuses the string
        if char != "\\":
            out.append(char)
            i += 1
            continue
        code = text[i + 1]
        if code == "x":
            out.append(chr(int(text[i + 2:i + 4], 16)))
            i += 4
        elif code in GO_ESCAPES:
            out.append(GO_ESCAPES[code])
            i += 2
        else:
            return None
    return "".join(out)


def labels(**pairs: str) -> dict[str, str]:
    """A series' labels as Prometheus sends them: an empty label is no label."""
    return {name: value for name, value in pairs.items() if value}


def ok(data: object) -> tuple[int, bytes]:
    return 200, json.dumps({"status": "success", "data": data}).encode()


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def prom() -> AsyncIterator[tuple[Stored, FaultServer]]:
    stored = Stored()
    async with FaultServer(mode="api", api=stored.respond) as server:
        yield stored, server


def source(server: FaultServer, clock: Clock, **kwargs: object) -> PrometheusSource:
    settings = load_settings(server.base_url, selector=str(kwargs.pop("selector", "")),
                             token=kwargs.pop("token", None))  # type: ignore[arg-type]
    return PrometheusSource(settings, clock=clock, **kwargs)  # type: ignore[arg-type]


def every(t0: float, t1: float, step: float = 15.0) -> list[float]:
    return [t0 + step * i for i in range(int((t1 - t0) / step) + 1)]


def seen(scrapes: list[Scrape]) -> list[tuple[str | None, float, str | None]]:
    return [(s.target.name, s.t, s.failure) for s in scrapes]


def running(scrape: Scrape) -> float:
    assert scrape.samples is not None
    [sample] = [s for s in scrape.samples.samples if s.name == RUNNING]
    return sample.value


async def test_the_instances_prometheus_scrapes_are_the_targets(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, B): [(T0 - 5, 1.0)], ("other", A): [(T0 - 5, 2.0)],
                      (JOB, A): [(T0 - 5, 3.0)]}
    async with source(server, Clock()) as src:
        targets = await src.discover()
    assert [(t.url, t.name, t.group) for t in targets] == [  # by (job, instance)
        (f"{server.base_url}#other/{A}", A, "other"), (f"{server.base_url}#{JOB}/{A}", A, JOB),
        (f"{server.base_url}#{JOB}/{B}", B, JOB)]


async def test_an_instance_that_never_came_up_is_found_but_an_exporter_beside_it_is_not(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    stored.up = {(JOB, "node-exporter:9100"): [(T0 - 5, "1")], (JOB, A): [(T0 - 5, "1")],
                 (JOB, B): [(T0 - 20, "0"), (T0 - 5, "0")]}  # the exporter listed first
    async with source(server, Clock()) as src:
        assert [t.name for t in await src.discover()] == [A, B]


async def test_a_prometheus_with_no_inference_server_says_so(
        prom: tuple[Stored, FaultServer]) -> None:
    _, server = prom
    async with source(server, Clock(), selector='{namespace="prod"}') as src:
        with pytest.raises(PrometheusError) as raised:
            await src.discover()
    assert raised.value.kind == "bad_payload"
    assert str(raised.value) == (f"Prometheus {server.base_url} has no vLLM/SGLang/llama.cpp/"
                                 'TRT-LLM or GPU exporter series matching {namespace="prod"}')
    async with source(server, Clock()) as src:
        with pytest.raises(PrometheusError, match=r"GPU exporter series$"):
            await src.discover()


async def test_each_stored_scrape_is_read_once_in_time_order(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(t, t - T0) for t in every(T0 - 90, T0 + 120)],
                      (JOB, B): [(t + 5, t - T0) for t in every(T0 - 90, T0 + 120)]}
    clock = Clock()
    async with source(server, clock, lookback_s=60.0, interval_s=15.0) as src:
        await src.discover()
        first = await src.poll_once()
        # the first refresh reads lookback_s back, up to now
        assert [(s.target.name, s.t) for s in first] == sorted(
            [(A, t) for t in every(T0 - 45, T0)] + [(B, t + 5) for t in every(T0 - 60, T0 - 15)],
            key=lambda pair: pair[1])
        assert all(s.ok and running(s) == s.t - T0 - (5 if s.target.name == B else 0)
                   for s in first)
        delivered = list(first)
        for now in (T0 + 20, T0 + 33, T0 + 70, T0 + 130):
            clock.now = now
            delivered += await src.poll_once()
    times = [(s.target.name, s.t) for s in delivered]
    assert len(times) == len(set(times))  # nothing twice
    assert [t for name, t in times if name == A] == every(T0 - 45, T0 + 120)
    assert [t - 5 for name, t in times if name == B] == every(T0 - 60, T0 + 120)
    assert all(s.ok for s in delivered)


async def test_later_refreshes_stop_short_of_now_for_scrapes_still_landing(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    clock = Clock()
    async with source(server, clock, lookback_s=60.0) as src:
        await src.discover()
        await src.poll_once()
        clock.now = T0 + 10
        await src.poll_once()
    refreshes = [q for q in stored.queries if q.get("query", "").startswith("{")]
    assert float(refreshes[0]["time"]) == T0
    assert "[60000ms]" in refreshes[0]["query"]
    assert float(refreshes[1]["time"]) == T0 + 10 - INGEST_LAG_S
    assert "[10000ms]" in refreshes[1]["query"]


async def test_a_selector_narrows_every_query(prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    async with source(server, Clock(), selector='{namespace="prod"}') as src:
        await src.discover()
        await src.poll_once()
    queries = [q["query"] for q in stored.queries if "query" in q]
    assert len(queries) == 4 and all('namespace="prod"' in q for q in queries)
    assert [q for q in queries if q.startswith("up")] == [
        f'up{{namespace="prod", job=~"{JOB}"}}[60000ms]'] * 2


async def test_a_down_instance_fails_with_prometheus_own_reason(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 20, 1.0)]}
    stored.up = {(JOB, A): [(T0 - 20, "1"), (T0 - 5, "0")]}
    stored.last_error = {(JOB, A): "Get \"http://10.0.0.1:8000/metrics\": connection refused"}
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        scrapes = await src.poll_once()
    assert seen(scrapes) == [(A, T0 - 20, None), (A, T0 - 5, "down")]
    assert scrapes[1].error == (f"Prometheus reports up == 0 (its scrape of {A} failed): "
                                'Get "http://10.0.0.1:8000/metrics": connection refused')


async def test_a_down_instance_without_a_reason_from_prometheus(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 20, 1.0)]}
    stored.up = {(JOB, A): [(T0 - 5, "0")]}
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        scrapes = await src.poll_once()
    assert scrapes[-1].error == f"Prometheus reports up == 0 (its scrape of {A} failed)"


async def test_an_instance_with_no_fresh_series_is_stale_and_says_why(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(t, 1.0) for t in every(T0 - 60, T0)],
                      (JOB, B): [(t, 1.0) for t in every(T0 - 60, T0)]}
    stored.up = {(JOB, B): [(t, "1") for t in every(T0 - 60, T0 + 120)]}
    clock = Clock()
    async with source(server, clock, lookback_s=60.0, interval_s=1.0) as src:
        await src.discover()
        await src.poll_once()
        clock.now = T0 + 45  # three scrape intervals (15 s) and no series since
        assert [s for s in await src.poll_once() if not s.ok] == []
        clock.now = T0 + 46
        stale = {s.target.name: s for s in await src.poll_once() if not s.ok}
    assert set(stale) == {A, B} and {s.failure for s in stale.values()} == {"bad_payload"}
    assert {s.t for s in stale.values()} == {T0 + 46}
    assert stale[A].error == ("no fresh series in Prometheus for 46 s: target removed, or "
                              "Prometheus not scraping it")
    assert stale[B].error.startswith("Prometheus scrapes it (up == 1) but has no vLLM/SGLang "
                                     "series for it")


async def test_stale_waits_at_least_ten_seconds_and_three_refresh_intervals(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 1, 1.0), (T0, 1.0)]}  # scraped every second
    clock = Clock()
    async with source(server, clock, lookback_s=60.0, interval_s=5.0) as src:
        await src.discover()
        await src.poll_once()
        clock.now = T0 + 15  # 3 x the 5 s refresh
        assert all(s.ok for s in await src.poll_once())
        clock.now = T0 + 15.5
        assert [s.failure for s in await src.poll_once()] == ["bad_payload"]
    stored.scrapes = {(JOB, A): [(T0 - 1, 1.0), (T0, 1.0)]}
    async with source(server, Clock(), lookback_s=60.0, interval_s=1.0) as src:
        await src.discover()
        await src.poll_once()
        src.clock = Clock(T0 + 10)  # type: ignore[method-assign]
        assert all(s.ok for s in await src.poll_once())
        src.clock = Clock(T0 + 10.5)  # type: ignore[method-assign]
        assert [s.failure for s in await src.poll_once()] == ["bad_payload"]


async def test_when_prometheus_cannot_be_read_every_instance_fails_with_the_reason(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)], (JOB, B): [(T0 - 5, 1.0)]}
    async with source(server, Clock()) as src:
        await src.discover()
        stored.refuse = (503, b'{"status": "error", "error": "TSDB  not\\nready"}')
        failed = await src.poll_once()
    assert seen(failed) == [(A, T0, "down"), (B, T0, "down")]
    assert failed[0].error == f"Prometheus {server.base_url}: HTTP 503: TSDB not ready"


async def test_before_any_instance_is_known_a_refresh_raises(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.refuse = (400, b'{"status": "error", "error": "bad query"}')
    async with source(server, Clock()) as src:
        with pytest.raises(PrometheusError) as raised:
            await src.poll_once()
    assert raised.value.kind == "bad_payload"
    assert str(raised.value) == f"Prometheus {server.base_url}: HTTP 400: bad query"


@pytest.mark.parametrize(("token", "hint"), [
    (None, "it needs a bearer token (token_env / token_file under [prometheus])"),
    (Secret("s3cret"), "check the token"),
])
@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_token_is_an_auth_failure_with_a_hint(
        prom: tuple[Stored, FaultServer], status: int, token: Secret | None, hint: str) -> None:
    stored, server = prom
    stored.refuse = (status, b"")
    async with source(server, Clock(), token=token) as src:
        with pytest.raises(PrometheusError) as raised:
            await src.discover()
    assert raised.value.kind == "auth"
    assert str(raised.value) == f"Prometheus {server.base_url}: HTTP {status}: {hint}"


async def test_the_token_is_sent_and_never_quoted_back(prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.refuse = (500, json.dumps({"status": "error", "error": "echo: s3cret " + "x" * 300})
                     .encode())
    async with source(server, Clock(), token=Secret("s3cret")) as src:
        with pytest.raises(PrometheusError) as raised:
            await src.discover()
    assert stored.headers[-1]["authorization"] == "Bearer s3cret"
    assert raised.value.kind == "down"
    said = str(raised.value).split("HTTP 500: ")[1]
    assert said == ("echo: *** " + "x" * 300)[:200] and "s3cret" not in str(raised.value)


@pytest.mark.parametrize(("answer", "kind", "said"), [
    (b"<html>bad gateway</html>", "bad_payload", "not a Prometheus API answer"),
    (b'{"status": "error"}', "bad_payload", "not a Prometheus API answer"),
    (b"[1, 2]", "bad_payload", "not a Prometheus API answer"),
])
async def test_an_answer_that_is_not_the_apis_is_bad_payload(
        prom: tuple[Stored, FaultServer], answer: bytes, kind: str, said: str) -> None:
    stored, server = prom
    stored.refuse = (200, answer)
    async with source(server, Clock()) as src:
        with pytest.raises(PrometheusError) as raised:
            await src.discover()
    assert raised.value.kind == kind
    assert str(raised.value) == f"Prometheus {server.base_url}: HTTP 200: {said}"


async def test_the_backfill_replays_the_window_and_refreshes_go_on_after_it(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): sorted([(t, 1.0) for t in every(T0 - 3600, T0 + 60)]
                                       + [(T0 + 1, 1.0)])}  # in flight at the backfill
    clock = Clock()
    async with source(server, clock, window_s=1800.0, interval_s=1.0) as src:
        scrapes = await src.backfill()
        [query] = [q for q in stored.queries if q["path"].endswith("query_range")]
        assert (float(query["start"]), float(query["end"])) == (T0 - 1800, T0)
        assert float(query["step"]) == DEFAULT_BACKFILL_STEP_S
        assert [s.t for s in scrapes] == every(T0 - 1800, T0)
        assert [t.name for t in src.targets] == [A]
        clock.now = T0 + 30
        later = await src.poll_once()
    assert [s.t for s in later] == [T0 + 1, T0 + 15]  # from the backfill's end less the lag


async def test_the_backfill_step_follows_the_interval_the_setting_and_the_point_limit(
        prom: tuple[Stored, FaultServer]) -> None:
    _, server = prom
    src = source(server, Clock(), interval_s=20.0)
    assert src.backfill_step() == 20.0  # at least the refresh interval
    assert source(server, Clock(), interval_s=1.0).backfill_step() == DEFAULT_BACKFILL_STEP_S
    long_span = MAX_POINTS * 30.0
    assert src.backfill_step(long_span) == 30.0  # never over Prometheus's points per series
    stepped = PrometheusSource(load_settings(server.base_url, backfill_step_s=5.0),
                               interval_s=20.0)
    assert stepped.backfill_step() == 5.0
    assert PrometheusSource(load_settings(server.base_url), interval_s=1.0,
                            window_s=MAX_POINTS * 60.0).backfill_step() == 60.0


async def backfilled(got: list[Scrape], until: float) -> None:
    while not got or got[-1].t < until:
        await asyncio.sleep(0.01)


async def test_run_backfills_then_refreshes_and_survives_a_failing_consumer(
        prom: tuple[Stored, FaultServer], caplog: pytest.LogCaptureFixture) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(t, 1.0) for t in every(T0 - 120, T0)]}
    clock = Clock()
    got: list[Scrape] = []
    stop = asyncio.Event()

    async def on_scrape(scrape: Scrape) -> None:
        got.append(scrape)
        if len(got) == 1:
            raise RuntimeError("a consumer's bug")
        if scrape.t >= T0 + 15:
            stop.set()

    async with source(server, clock, window_s=60.0, interval_s=0.05) as src:
        task = asyncio.create_task(src.run(on_scrape, stop=stop))
        await asyncio.wait_for(backfilled(got, T0), 30)
        stored.scrapes[(JOB, A)].append((T0 + 15, 1.0))
        clock.now = T0 + 20
        await asyncio.wait_for(task, 30)
    assert [s.t for s in got] == [*every(T0 - 60, T0), T0 + 15]
    [logged] = [r for r in caplog.records if r.name == "kvtop.collect.prometheus.source"]
    assert logged.getMessage() == f"on_scrape failed for {A}" and logged.exc_info is not None


async def test_retention_is_read_from_prometheus_or_unknown(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    async with source(server, Clock()) as src:
        assert await src.retention_s() == 15 * 86400.0
        stored.retention = "10GiB"
        assert await src.retention_s() is None
        stored.retention = 5
        assert await src.retention_s() is None
        stored.refuse = (404, b"")
        assert await src.retention_s() is None


@pytest.mark.parametrize(("text", "seconds"), [
    ("15d", 15 * 86400.0), ("1w2d", 9 * 86400.0), ("90m", 5400.0), ("500ms", 0.5),
    ("1y", 365 * 86400.0), ("10GiB or 2h", 7200.0), ("15d or 10GiB", 15 * 86400.0),
    ("10GiB", None), ("", None), ("15x", None), ("1d 2h", None),  # not as Prometheus writes
])
def test_retention_as_prometheus_writes_it(text: str, seconds: float | None) -> None:
    assert parse_retention(text) == seconds


@pytest.mark.parametrize(("url", "base"), [
    ("prom:9090", "http://prom:9090"), (" https://prom/prefix/ ", "https://prom/prefix"),
    ("https://PROMBOX//", "https://PROMBOX"),  # only the slashes go, whatever ends the name
])
def test_a_prometheus_url_as_people_write_it(url: str, base: str) -> None:
    settings = load_settings(url, selector=' {job="vllm"} ')
    assert (settings.url, settings.base, settings.selector) == (base, base, '{job="vllm"}')


@pytest.mark.parametrize(("url", "step", "says"), [
    ("ftp://prom", None, "not a Prometheus URL"),
    ("http://", None, "not a Prometheus URL"),
    ("http://user:pw@prom:9090", None, "credentials in a URL"),
    ("prom:9090", 0.0, "backfill_step must be > 0 seconds"),
    ("prom:9090", -15.0, "backfill_step must be > 0 seconds"),
])
def test_a_prometheus_that_cannot_be_used_is_refused(url: str, step: float | None,
                                                     says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        load_settings(url, backfill_step_s=step)


def test_any_backfill_step_over_zero_is_taken_as_given() -> None:
    for step in (0.001, 0.5, 1.0, 15.0):  # PromQL takes a step in fractions of a second
        assert load_settings("prom:9090", backfill_step_s=step).backfill_step_s == step
    for step in (0.0, -1.0):
        with pytest.raises(ValueError) as raised:
            load_settings("prom:9090", backfill_step_s=step)
        assert str(raised.value) == "backfill_step must be > 0 seconds"


def down_at(stored: Stored, key: tuple[str, str], t: float) -> None:
    stored.scrapes.setdefault(key, [(T0 - 60, 1.0)])
    stored.up.setdefault(key, []).append((t, "0"))


async def test_the_reason_of_an_instance_without_a_job_or_instance_label(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    for key in (("", A), (JOB, "")):
        down_at(stored, key, T0 - 5)
        stored.last_error[key] = f"refused {key}"
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        down = [s for s in await src.poll_once() if s.failure == "down"]
    assert sorted((s.target.group, s.target.name, s.error) for s in down) == [
        ("", A, f"Prometheus reports up == 0 (its scrape of {A} failed): refused ('', '{A}')"),
        (JOB, "", f"Prometheus reports up == 0 (its scrape of  failed): refused ('{JOB}', '')")]


@pytest.mark.parametrize("answer", [
    [], {}, {"activeTargets": 5}, {"activeTargets": [5, {"labels": ["x"], "lastError": "x"},
                                                     {"labels": {"job": 5}, "lastError": "x"}]},
    {"activeTargets": [{"labels": {"job": [JOB], "instance": A}, "lastError": "x"}]},
])
async def test_scrape_errors_not_shaped_like_prometheus_only_lose_the_detail(
        prom: tuple[Stored, FaultServer], answer: object) -> None:
    stored, server = prom
    down_at(stored, (JOB, A), T0 - 5)
    stored.targets_answer = answer
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        down = [s for s in await src.poll_once() if not s.ok]
    assert [(s.failure, s.error) for s in down] == [
        ("down", f"Prometheus reports up == 0 (its scrape of {A} failed)")]


async def test_scrape_errors_are_asked_for_at_most_every_30_s_and_only_when_needed(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 60, 1.0)]}
    stored.last_error = {(JOB, A): "refused"}
    clock = Clock()
    asked = []
    async with source(server, clock, lookback_s=60.0) as src:
        await src.discover()
        for now, up in ((T0, "1"), (T0 + 10, "0"), (T0 + 20, "0"), (T0 + 39.5, "0"),
                        (T0 + 40, "0")):
            stored.up.setdefault((JOB, A), []).append((now - 2.2, up))  # landed by now
            clock.now = now
            down = [s for s in await src.poll_once() if s.failure == "down"]
            asked.append(sum(q["path"].endswith("/targets") for q in stored.queries))
            assert len(down) == (up == "0")  # the reason cached meanwhile
            assert all(s.error.endswith("failed): refused") for s in down)
    assert asked == [0, 1, 1, 1, 2]  # first needed at T0 + 10, again 30 s after


async def test_scrape_errors_prometheus_cannot_give_only_lose_the_detail(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    down_at(stored, (JOB, A), T0 - 5)
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        real = stored.respond
        stored.respond = lambda request: (  # type: ignore[method-assign]
            (500, b"") if request.path.endswith("/targets") else real(request))
        server.api = stored.respond
        down = [s for s in await src.poll_once() if not s.ok]
    assert [s.error for s in down] == [f"Prometheus reports up == 0 (its scrape of {A} failed)"]


def escaped(token: str) -> str:
    """The token as JSON may write it: every character a \\u escape (valid JSON, and not
    the token's bytes, so only the decoded text shows it)."""
    return "".join(f"\\u{ord(c):04x}" for c in token)


# a token kvtop masks everywhere it writes, and one a character short of that (only the
# settings' own token masks it)
@pytest.mark.parametrize("secret", ["s3cret-token", "t0k3n-7"])
async def test_a_token_echoed_in_json_escapes_is_masked_in_what_is_quoted(
        prom: tuple[Stored, FaultServer], secret: str) -> None:
    assert len("t0k3n-7") == MIN_KNOWN_SECRET - 1
    stored, server = prom
    token = Secret(secret)
    down_at(stored, (JOB, A), T0 - 5)
    async with source(server, Clock(), lookback_s=60.0, token=token) as src:
        await src.discover()
        stored.targets_answer = json.loads(
            f'{{"activeTargets": [{{"labels": {{"job": "{JOB}", "instance": "{A}"}}, '
            f'"lastError": "sent {escaped(token.reveal())}"}}]}}')
        real = stored.respond

        def echo(request: Request) -> tuple[int, bytes]:
            status, body = real(request)
            if request.path.endswith("/targets"):
                body = body.replace(token.reveal().encode(), escaped(token.reveal()).encode())
            return status, body

        server.api = echo
        [down] = [s for s in await src.poll_once() if not s.ok]
        assert down.error is not None and down.error.endswith("failed): sent ***")
        server.api = lambda request: (500, json.dumps(
            {"status": "error", "error": "x"}).replace(
            '"x"', f'"sent {escaped(token.reveal())}"').encode())
        with pytest.raises(PrometheusError) as raised:
            await src.discover()
    assert str(raised.value).endswith("HTTP 500: sent ***")


async def test_a_bug_reading_an_answer_fails_the_instances_and_the_source_goes_on(
        prom: tuple[Stored, FaultServer], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()

        def planted(result: object) -> object:
            raise KeyError("a bug")

        with monkeypatch.context() as patch:
            patch.setattr("kvtop.collect.prometheus.source.group_scrapes", planted)
            [failed] = await src.poll_once()
        assert (failed.failure, failed.error) == (
            "bad_payload", "kvtop could not read Prometheus's answer (KeyError); a bug in "
                           "kvtop, please report it")
        [logged] = [r for r in caplog.records if r.name == "kvtop.collect.prometheus.source"]
        assert logged.getMessage() == "reading a Prometheus answer failed"
        assert logged.exc_info is not None and "a bug" in caplog.text
        src.clock = Clock(T0 + 1)  # type: ignore[method-assign]
        stored.scrapes[(JOB, A)].append((T0 + 0.5, 2.0))
        again = await src.poll_once()  # the failed span is read again, and what came after
        assert [(s.t, s.ok) for s in again] == [(T0 - 5, True), (T0 + 0.5, True)]


@mode("slow_range")
async def _slow_range(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    """The API, with range queries (a backfill) answered only after 4 s."""
    if req.path.endswith("/query_range"):
        await asyncio.sleep(4.0)
    status, body = srv.api(req)
    return await srv.respond(w, status, body, content_type="application/json")


async def test_a_backfill_gets_six_times_the_time_of_a_refresh() -> None:
    stored = Stored(scrapes={(JOB, A): [(T0 - 30, 1.0)]})
    async with FaultServer(mode="slow_range", api=stored.respond) as server:
        src = PrometheusSource(load_settings(server.base_url), timeout_s=3.0, clock=Clock())
        async with src:
            assert [s.t for s in await src.backfill(60.0)] == [T0 - 30]  # 4 s: within 18 s


async def test_the_backfill_step_follows_the_span_asked_for(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    async with source(server, Clock(), interval_s=1.0, window_s=60.0) as src:
        await src.backfill(MAX_POINTS * 30.0)
    [query] = [q for q in stored.queries if q["path"].endswith("query_range")]
    assert float(query["step"]) == 30.0


async def test_runtime_info_not_shaped_like_prometheus_is_no_retention(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    async with source(server, Clock()) as src:
        for answer in ([], {"storageRetention": ["15d"]}):
            stored.runtime_answer = answer
            assert await src.retention_s() is None


async def test_a_down_instance_is_down_not_stale_between_its_failed_scrapes(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(t, 1.0) for t in every(T0 - 60, T0 + 30)]}
    stored.up = {(JOB, B): [(T0 - 5, "0"), (T0 + 25, "0")]}  # never came up; scraped sparsely
    clock = Clock()
    async with source(server, clock, window_s=60.0) as src:
        await src.discover()  # B found by its up == 0
        await src.backfill()
        clock.now = T0 + 1  # no up sample of B since the backfill ended
        assert [s for s in await src.poll_once() if s.target.name == B] == []
        clock.now = T0 + 30
        [down] = [s for s in await src.poll_once() if s.target.name == B]
    assert (down.t, down.failure) == (T0 + 25, "down")


def matrix(*result: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix",
                                                     "result": list(result)}}).encode()


def good_series(**extra: object) -> dict[str, object]:
    return {"metric": labels(__name__=RUNNING, job=JOB, instance=A), "values": [[T0 - 5, "1"]],
            **extra}


NOT_AN_ANSWER = "not a Prometheus query answer: "


MALFORMED_REFRESHES = {  # the answer -> what the instances' failure says
    "data a list": (b'{"status": "success", "data": []}', "'data' holds no 'result' list"),
    "result an object": (b'{"status": "success", "data": {"result": {"a": 1}}}',
                         "'data' holds no 'result' list"),
    "a series not an object": (matrix(good_series(), 1), "a series is not an object"),
    "a nameless series, then one not an object": (
        matrix({"metric": {}, "values": [[T0 - 5, "1"]]}, 5), "a series is not an object"),
    "metric a list": (matrix(good_series(metric=["job", JOB])),
                      "a series' 'metric' is not an object of strings"),
    "a label a number": (matrix(good_series(metric={"job": JOB, "engine": 0})),
                         "a series' 'metric' is not an object of strings"),
    "a label a list": (matrix(good_series(metric={"job": JOB, "engine": ["0"]})),
                       "a series' 'metric' is not an object of strings"),
    "values not a list": (matrix(good_series(values="1")),
                          "a series' 'values' are not [time, value] pairs"),
    "3-element values": (matrix(good_series(values=[[T0 - 5, "1", 2]])),
                         "a series' 'values' are not [time, value] pairs"),
    "a time not a number": (matrix(good_series(values=[["abc", "1"]])),
                            "a sample time is 'abc', not a number"),
    "a time a list": (matrix(good_series(values=[[[1], "1"]])),
                      "a sample time is '[1]', not a number"),
    "a long time": (matrix(good_series(values=[["9" * 60, "1"]])),
                    f"a sample time is {'9' * 40!r}, not a number"),
}


@pytest.mark.parametrize("name", list(MALFORMED_REFRESHES))
async def test_a_malformed_refresh_fails_every_instance_saying_what_is_wrong(
        prom: tuple[Stored, FaultServer], name: str) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)], (JOB, B): [(T0 - 5, 1.0)]}
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        _heads.clear()  # series never read before: their labels are checked as they come
        stored.hostile["refresh"], said = MALFORMED_REFRESHES[name]
        failed = await src.poll_once()
    assert [(s.target.name, s.failure, s.error) for s in failed] == [
        (A, "bad_payload", NOT_AN_ANSWER + said), (B, "bad_payload", NOT_AN_ANSWER + said)]


@pytest.mark.parametrize(("values", "said"), [
    ("1", "a series' 'values' is not a list"),
    ([[T0 + 1, "1", 2]], "a series' 'values' are not [time, value] pairs"),
    (["x"], "a series' 'values' are not [time, value] pairs"),
    ([["abc", "1"]], "a sample time is 'abc', not a number"),
])
async def test_a_series_read_before_is_checked_as_carefully_the_next_time(
        prom: tuple[Stored, FaultServer], values: object, said: str) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    clock = Clock()
    async with source(server, clock, lookback_s=60.0) as src:
        await src.discover()
        assert [s.ok for s in await src.poll_once()] == [True]  # its labels are known now
        stored.hostile["refresh"] = matrix({
            "metric": labels(__name__=RUNNING, job=JOB, instance=A, model_name="m",
                             engine="0"), "values": values})
        clock.now = T0 + 5
        failed = [s for s in await src.poll_once() if s.failure == "bad_payload"]
    assert [s.error for s in failed] == [NOT_AN_ANSWER + said]


@pytest.mark.parametrize(("kind", "answer", "said"), [
    ("discover", json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels(job=JOB, instance=A), "value": [T0, "1", 2]}]}}).encode(),
     "a series' 'value' are not [time, value] pairs"),
    ("discover", json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels(job=JOB, instance=A), "value": ["abc", "1"]}]}}).encode(),
     "a sample time is 'abc', not a number"),
    ("discover", json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels(job=JOB, instance=A), "value": "1"}]}}).encode(),
     "a series' 'value' are not [time, value] pairs"),
    ("up", matrix({"metric": labels(__name__="up", job=JOB, instance=A),
                   "values": [[T0 - 5, "0", 2]]}),
     "a series' 'values' are not [time, value] pairs"),
    ("up", matrix({"metric": labels(__name__="up", job=JOB, instance=A),
                   "values": [["abc", "0"]]}), "a sample time is 'abc', not a number"),
    ("up", matrix({"metric": labels(__name__="up", job=JOB, instance=A),
                   "values": [5]}), "a series' 'values' are not [time, value] pairs"),
    ("up", matrix(7), "a series is not an object"),
    ("up", matrix({"metric": {"job": JOB, "instance": 5}, "values": [[T0 - 5, "0"]]}),
     "a series' 'metric' is not an object of strings"),
])
async def test_a_malformed_discovery_says_what_is_wrong(
        prom: tuple[Stored, FaultServer], kind: str, answer: bytes, said: str) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    stored.hostile[kind] = answer
    async with source(server, Clock(), lookback_s=60.0) as src:
        with pytest.raises(PrometheusError) as raised:
            await src.discover()
    assert (raised.value.kind, str(raised.value)) == ("bad_payload", NOT_AN_ANSWER + said)


def test_grouping_refuses_a_result_that_is_not_a_list() -> None:
    with pytest.raises(PrometheusError) as raised:
        group_scrapes({"a": 1})
    assert (raised.value.kind, str(raised.value)) == (
        "bad_payload", NOT_AN_ANSWER + "'result' is not a list")


async def test_series_without_a_job_or_instance_label_are_read_as_their_own_instances(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {("", A): [(T0 - 5, 1.0)], (JOB, ""): [(T0 - 4, 2.0)]}
    async with source(server, Clock(), lookback_s=60.0) as src:
        targets = await src.discover()
        scrapes = await src.poll_once()
    base = server.base_url
    assert [(t.url, t.group, t.name) for t in targets] == [
        (f"{base}#/{A}", "", A), (f"{base}#{JOB}/", JOB, "")]
    assert [(s.target.url, s.t, running(s)) for s in scrapes] == [
        (f"{base}#/{A}", T0 - 5, 1.0), (f"{base}#{JOB}/", T0 - 4, 2.0)]


async def test_a_value_that_is_not_a_number_is_read_as_nan_and_a_nameless_series_as_nameless(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        stored.hostile["refresh"] = matrix(
            good_series(values=[[T0 - 5, "many"]]),
            {"metric": labels(job=JOB, instance=A, engine="0"), "values": [[T0 - 5, "2"]]})
        [scrape] = await src.poll_once()
    assert scrape.samples is not None
    got = {s.name: s.value for s in scrape.samples.samples}
    assert set(got) == {RUNNING, ""} and math.isnan(got[RUNNING]) and got[""] == 2.0


async def test_a_refresh_of_a_large_fleet_is_read_whole(
        prom: tuple[Stored, FaultServer]) -> None:
    # more series than OFF_LOOP_SERIES: grouped in a worker thread, the same scrapes
    stored, server = prom
    fleet = [f"10.1.{i // 250}.{i % 250}:8000" for i in range(OFF_LOOP_SERIES + 1)]
    stored.scrapes = {(JOB, instance): [(T0 - 5, 1.0)] for instance in fleet}
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        scrapes = await src.poll_once()
    assert sorted(s.target.name for s in scrapes if s.ok) == sorted(fleet)


def test_label_text_cached_from_answers_stays_under_its_cap() -> None:
    # a Prometheus naming ever new, long label values costs a re-read, never memory
    big = "x" * (1 << 20)
    for i in range(MAX_CACHED_HEAD_CHARS // len(big) + 8):
        group_scrapes([{"metric": {"__name__": RUNNING, "job": JOB, "instance": A,
                                   "pad": big, "n": str(i)}, "values": [[T0, "1"]]}])
        held = sum(len(k) + len(v) for pairs in _heads for k, v in pairs)
        assert held <= MAX_CACHED_HEAD_CHARS


async def test_a_refresh_right_after_another_asks_for_the_smallest_range(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    clock = Clock()
    async with source(server, clock, lookback_s=60.0) as src:
        await src.discover()
        await src.poll_once()
        await src.poll_once()  # at the same instant: nothing new to ask for
    refreshes = [q["query"] for q in stored.queries if q.get("query", "").startswith("{")]
    assert refreshes[-1].endswith("[1ms]")  # Prometheus refuses an empty range


async def test_each_instance_is_judged_stale_on_its_own(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    C = "10.0.0.3:8000"
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)], (JOB, B): [], (JOB, C): []}
    stored.up = {(JOB, B): [(T0 - 10, "1")]}  # read exactly the 10 s limit ago: still fresh
    async with source(server, Clock(), lookback_s=60.0, interval_s=1.0) as src:
        await src.discover()  # B and C have series names, but no sample in the refresh
        stale = {s.target.name: s.error for s in await src.poll_once() if not s.ok}
    assert stale == {
        B: "Prometheus scrapes it (up == 1) but has no vLLM/SGLang series for it: metrics "
           "off (--disable-log-stats) or dropped by relabelling?",
        C: "no fresh series in Prometheus: target removed, or Prometheus not scraping it"}


async def test_up_samples_of_instances_without_a_job_or_instance_label_are_theirs(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    for key in (("", A), (JOB, "")):  # scraped (up == 1), their series gone for 30 s
        stored.scrapes[key] = [(T0 - 30, 1.0)]
        stored.up[key] = [(T0 - 30, "1"), (T0 - 5, "1")]
    async with source(server, Clock(), lookback_s=60.0, interval_s=1.0) as src:
        await src.discover()
        stale = [s.error for s in await src.poll_once() if not s.ok]
    assert len(stale) == 2 and all(e.startswith("Prometheus scrapes it (up == 1)") for e in stale)


async def test_down_instances_are_found_in_every_job_whatever_its_name(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    other = "kube.sglang-1"  # regex characters in a job's name are matched as written
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)], (other, A): [(T0 - 5, 1.0)]}
    stored.up = {(JOB, B): [(T0 - 5, "0")], (other, B): [(T0 - 5, "0")],
                 ("kube-sglang-1", B): [(T0 - 5, "0")]}  # another job, not one of them
    async with source(server, Clock(), lookback_s=60.0) as src:
        targets = await src.discover()
    assert [(t.group, t.name) for t in targets] == [(other, A), (other, B), (JOB, A), (JOB, B)]


@pytest.mark.parametrize("job", ['bad"job', "back\\slash", "new\nline", 'all"\\\n\t|.*'])
async def test_a_job_holding_quotes_backslashes_or_newlines_is_quoted_not_spliced(
        prom: tuple[Stored, FaultServer], job: str) -> None:
    """honor_labels lets a target set job="bad\\"job": spliced into the `up` query, it was a
    parse error, and every instance (the healthy ones too) failed with it."""
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)], (job, A): [(T0 - 5, 1.0)]}
    stored.up = {(JOB, B): [(T0 - 5, "0")], (job, B): [(T0 - 5, "0")],
                 (job + "x", B): [(T0 - 5, "0")]}  # a regex of it would match this too
    async with source(server, Clock(), lookback_s=60.0) as src:
        targets = await src.discover()
        scrapes = await src.poll_once()
    assert sorted((t.group, t.name) for t in targets) == sorted(
        [(JOB, A), (JOB, B), (job, A), (job, B)])
    assert sorted((s.target.group, s.target.name, s.failure) for s in scrapes) == sorted(
        [(JOB, A, None), (job, A, None), (JOB, B, "down"), (job, B, "down")])


async def test_instances_that_churn_are_forgotten_and_bounded(
        prom: tuple[Stored, FaultServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods rescheduled every refresh: the source once kept every instance it ever saw and
    re-reported each as stale every refresh (check grew 60 -> 321 MB in 80 s)."""
    monkeypatch.setattr(prometheus_source, "MAX_INSTANCES", 250)
    stored, server = prom
    clock = Clock()
    async with source(server, clock, lookback_s=60.0, interval_s=5.0) as src:
        for refresh in range(6):
            clock.now = T0 + 5 * refresh
            stored.scrapes = {(JOB, f"10.{refresh}.0.{i}:8000"): [(clock.now - 2.5, 1.0)]
                              for i in range(100)}
            delivered = await src.poll_once()
            assert len(src.targets) <= 250 and len(delivered) <= 250
        newest = {f"10.5.0.{i}:8000" for i in range(100)} | {f"10.4.0.{i}:8000"
                                                             for i in range(100)}
        assert newest <= {t.name for t in src.targets}  # the least recent went first
        assert len(src.targets) == 250
        stored.scrapes = {(JOB, A): [(T0 + 23 + prometheus_source.FORGET_AFTER_S, 1.0)]}
        clock.now = T0 + 26 + prometheus_source.FORGET_AFTER_S
        delivered = await src.poll_once()
    assert [t.name for t in src.targets] == [A]  # nothing heard of the others for 15 min
    assert [(s.target.name, s.ok) for s in delivered] == [(A, True)]


async def test_an_up_0_read_twice_at_the_edge_of_two_refreshes_is_one_failure(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 20, 1.0)]}
    stored.up = {(JOB, A): [(T0 - 20, "1"), (T0 - 1, "0")]}  # lands just before the first
    clock = Clock()
    async with source(server, clock, lookback_s=60.0) as src:
        await src.discover()
        delivered = await src.poll_once()  # reads up to now
        clock.now = T0 + 5
        delivered += await src.poll_once()  # reads its last seconds again
    assert [(s.t, s.failure) for s in delivered if s.failure] == [(T0 - 1, "down")]


async def test_the_newest_up_sample_decides_whatever_order_they_come_in(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(t, 1.0) for t in every(T0 - 60, T0 + 30)]}
    stored.up = {(JOB, B): [(T0 - 5, "0"), (T0 - 30, "1")]}  # down now, listed first
    clock = Clock()
    async with source(server, clock, window_s=60.0) as src:
        await src.discover()
        await src.backfill()
        clock.now = T0 + 1
        assert [s for s in await src.poll_once() if s.target.name == B] == []  # down, not stale


async def test_with_nothing_known_a_refresh_asks_only_for_the_series(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    async with source(server, Clock()) as src:
        assert await src.poll_once() == []
    assert len(stored.queries) == 1 and stored.queries[0]["query"].startswith("{")


async def test_run_waits_out_a_prometheus_that_refuses_and_reads_it_once_it_answers(
        prom: tuple[Stored, FaultServer], caplog: pytest.LogCaptureFixture) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    stored.refuse = (503, b'{"status": "error", "error": "starting"}')
    got: list[Scrape] = []
    stop = asyncio.Event()

    def on_scrape(scrape: Scrape) -> None:  # a plain function: nothing to await
        got.append(scrape)
        stop.set()

    async with source(server, Clock(), interval_s=0.05) as src:
        task = asyncio.create_task(src.run(on_scrape, stop=stop, backfill=False))
        await eventually(lambda: len(stored.headers) >= 2, "two refused refreshes")
        stored.refuse = None
        await asyncio.wait_for(task, 30)
    assert [(s.target.name, s.t, s.ok) for s in got] == [(A, T0 - 5, True)]
    assert not any(q["path"].endswith("query_range") for q in stored.queries)  # as told
    assert not [r for r in caplog.records if r.name == "kvtop.collect.prometheus.source"]


async def test_run_after_a_backfill_does_not_backfill_again(
        prom: tuple[Stored, FaultServer], caplog: pytest.LogCaptureFixture) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 30, 1.0), (T0 - 15, 1.0)]}
    got: list[Scrape] = []
    stop = asyncio.Event()
    async with source(server, Clock(), window_s=60.0, interval_s=0.05) as src:
        backfilled = await src.backfill()
        task = asyncio.create_task(src.run(got.append, stop=stop))
        await eventually(lambda: sum("query" in q for q in stored.queries) >= 3,
                         "a refresh after the backfill")
        stop.set()
        await asyncio.wait_for(task, 30)
    assert [s.t for s in backfilled] == [T0 - 30, T0 - 15] and got == []
    assert sum(q["path"].endswith("query_range") for q in stored.queries) == 1
    assert not [r for r in caplog.records if r.name == "kvtop.collect.prometheus.source"]


async def test_run_waits_its_interval_between_refreshes(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    got: list[Scrape] = []
    stop = asyncio.Event()
    async with source(server, Clock(), interval_s=30.0) as src:
        task = asyncio.create_task(src.run(got.append, stop=stop, backfill=False))
        await eventually(lambda: got, "the first refresh")
        await asyncio.sleep(0.3)  # a source refreshing without a pause asks dozens of times
        stop.set()
        await asyncio.wait_for(task, 30)
    assert sum(q["query"].startswith("{") for q in stored.queries) == 1


async def test_the_source_counts_its_requests_and_keeps_one_session_it_closes(
        prom: tuple[Stored, FaultServer], caplog: pytest.LogCaptureFixture) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    clock = Clock()
    async with source(server, clock, lookback_s=60.0) as src:
        await src.discover()
        for now in (T0, T0 + 5, T0 + 10):
            clock.now = now
            await src.poll_once()
        assert src.api.requests == len(stored.headers) == 8  # two a refresh, fleet-wide
    gc.collect()
    assert "Unclosed" not in caplog.text  # a session per request would leak its sockets


async def test_insecure_reads_a_prometheus_behind_a_self_signed_certificate(
        self_signed: ssl.SSLContext) -> None:
    stored = Stored(scrapes={(JOB, A): [(T0 - 5, 1.0)]})
    async with FaultServer(mode="api", api=stored.respond, ssl_context=self_signed) as server:
        async with source(server, Clock(), insecure=True) as src:
            assert [t.name for t in await src.discover()] == [A]
        async with source(server, Clock()) as src:
            with pytest.raises(PrometheusError, match="TLS certificate not trusted"):
                await src.discover()


async def test_a_prometheus_that_never_answers_times_out_within_the_timeout() -> None:
    async with FaultServer(mode="hang") as server:
        base = server.base_url
        src = PrometheusSource(load_settings(base), timeout_s=0.5, clock=Clock())
        async with src:
            with pytest.raises(PrometheusError) as raised:
                await asyncio.wait_for(src.discover(), 30)  # 30 s: it never gives up
    assert (raised.value.kind, str(raised.value)) == (
        "timeout", f"Prometheus {base}: no complete answer within 0.5 s")


@mode("brotli")
async def _brotli(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    """The API, its answers sent with an encoding kvtop does not ask for."""
    status, body = srv.api(req)
    return await srv.respond(w, status, body, content_type="application/json",
                             headers={"Content-Encoding": "br"})


async def test_an_answer_in_an_encoding_kvtop_cannot_read_is_bad_payload() -> None:
    stored = Stored(scrapes={(JOB, A): [(T0 - 5, 1.0)]})
    async with FaultServer(mode="brotli", api=stored.respond) as server:
        base = server.base_url
        async with source(server, Clock()) as src:
            with pytest.raises(PrometheusError) as raised:
                await src.discover()
    assert (raised.value.kind, str(raised.value)) == (
        "bad_payload", f"Prometheus {base}: unsupported Content-Encoding 'br'")


async def test_an_answer_over_a_megabyte_is_read_whole(
        prom: tuple[Stored, FaultServer]) -> None:
    # decoded in a worker thread, so the event loop never waits for it
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    pad = "x" * OFF_LOOP_BYTES
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        stored.hostile["refresh"] = matrix(good_series(metric=labels(
            __name__=RUNNING, job=JOB, instance=A, pad=pad)))
        [scrape] = await src.poll_once()
    assert scrape.ok and running(scrape) == 1.0
    assert scrape.samples is not None and scrape.samples.samples[0].labels == {"pad": pad}


@pytest.mark.parametrize(("selector", "says"), [
    ('namespace="prod"',
     'a label selector looks like {namespace="prod"}, not \'namespace="prod"\''),
    ('{namespace="prod"', 'a label selector looks like {namespace="prod"}, not '
                          '\'{namespace="prod"\''),
    ('namespace="prod"}', 'a label selector looks like {namespace="prod"}, not '
                          '\'namespace="prod"}\''),
    ('{__name__="up"}', "the selector picks instances by their labels; leave out __name__"),
])
def test_a_selector_that_cannot_be_used_is_refused_saying_why(selector: str, says: str) -> None:
    with pytest.raises(ValueError) as raised:
        load_settings("prom:9090", selector=selector)
    assert str(raised.value) == says


@pytest.mark.parametrize(("selector", "up_query"), [
    ("", f'up{{job=~"{JOB}"}}[60000ms]'),
    ("  ", f'up{{job=~"{JOB}"}}[60000ms]'),
    ("{}", f'up{{job=~"{JOB}"}}[60000ms]'),
    (' { namespace="prod",} ', f'up{{namespace="prod", job=~"{JOB}"}}[60000ms]'),
    # not PromQL (an unquoted value): passed on whole, for Prometheus to refuse in its words
    ("{tier=XX}", f'up{{tier=XX, job=~"{JOB}"}}[60000ms]'),
])
async def test_a_selector_is_added_to_queries_as_written_or_not_at_all(
        prom: tuple[Stored, FaultServer], selector: str, up_query: str) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    async with source(server, Clock(), selector=selector) as src:
        await src.discover()
    assert [q["query"] for q in stored.queries if q["query"].startswith("up")] == [up_query]


async def test_a_token_echoed_in_a_label_is_masked_before_anything_reads_it(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    async with source(server, Clock(), lookback_s=60.0, token=Secret("s3cret")) as src:
        await src.discover()
        stored.hostile["refresh"] = matrix(good_series(metric=labels(
            __name__=RUNNING, job=JOB, instance=A, header="Bearer s3cret")))
        [scrape] = await src.poll_once()
    assert scrape.samples is not None
    assert scrape.samples.samples[0].labels == {"header": "Bearer ***"}


def test_a_source_reads_every_second_with_a_timeout_of_twice_that_and_at_least_5_s() -> None:
    settings = load_settings("prom:9090")
    src = PrometheusSource(settings)
    assert (src.interval_s, src.window_s, src.lookback_s) == (1.0, 1800.0, 60.0)
    assert (src.api.timeout_s, src.api.insecure, src.targets) == (5.0, False, [])
    assert PrometheusSource(settings, interval_s=4.0).api.timeout_s == 8.0
    assert PrometheusSource(settings, timeout_s=2.0, insecure=True).api.timeout_s == 2.0
    assert src.clock is time.time and src.settings is settings


async def test_a_source_closes_quietly_before_its_first_read_and_when_closed_twice(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    async with source(server, Clock()):
        pass  # the command gave up before asking anything (a bad flag, Ctrl-C)
    src = source(server, Clock())
    async with src:
        assert [t.name for t in await src.discover()] == [A]
    await src.aclose()  # and once more, as a command's own clean-up may


@mode("first_late")
async def _first_late(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    """The API, its first answer sent only after ``delay_s``."""
    if srv.requests[0] is req and not await srv.pause(srv.delay_s):
        return False
    status, body = srv.api(req)
    return await srv.respond(w, status, body, content_type="application/json")


async def test_after_a_refresh_slower_than_the_interval_the_next_starts_at_once() -> None:
    # A slow Prometheus must not make the refreshes fall further behind: no pause after a
    # refresh that took longer than the interval (nothing known: one query a refresh).
    stored = Stored()
    async with FaultServer(mode="first_late", api=stored.respond, delay_s=1.5) as server:
        stop = asyncio.Event()
        async with source(server, Clock(), interval_s=1.0) as src:
            task = asyncio.create_task(src.run(lambda scrape: None, stop=stop, backfill=False))
            await eventually(lambda: len(server.requests) >= 2, "the second refresh")
            stop.set()
            await asyncio.wait_for(task, 30)
    first, second = server.requests[:2]
    # the next request comes right after the late answer; a pause of even 1 s is a bug
    assert second.at - first.at < server.delay_s + 0.9


async def test_a_backfill_of_a_week_asks_for_no_more_points_than_prometheus_gives(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    week = 7 * 86400.0
    stored.scrapes = {(JOB, A): [(T0 - week + 60, 1.0), (T0 - 60, 2.0)]}
    async with source(server, Clock(), interval_s=1.0, window_s=week) as src:
        assert [s.t for s in await src.backfill()] == [T0 - week + 60, T0 - 60]
    [query] = [q for q in stored.queries if q["path"].endswith("query_range")]
    assert float(query["step"]) == pytest.approx(week / 11_000)  # ~55 s, not the default 15


async def test_a_backfill_gives_up_on_a_silent_prometheus_after_six_times_the_timeout() -> None:
    async with FaultServer(mode="hang") as server:
        base = server.base_url
        async with PrometheusSource(load_settings(base), timeout_s=0.1, clock=Clock()) as src:
            with pytest.raises(PrometheusError) as raised:
                await asyncio.wait_for(src.backfill(60.0), 30)
    assert (raised.value.kind, str(raised.value)) == (
        "timeout", f"Prometheus {base}: no complete answer within 0.6 s")


def test_the_limits_and_periods_the_docs_give_are_the_sources() -> None:
    said = " ".join((REPO / "docs" / "prometheus.md").read_text(encoding="utf-8").split())
    assert f"Per refresh (default every {PROMETHEUS_INTERVAL_S:g} s;" in said
    assert f"A refresh reads up to {INGEST_LAG_S:g} s ago" in said
    assert f"read at most every {TARGETS_CACHE_S:g} s" in said
    forget_s = prometheus_source.FORGET_AFTER_S
    assert f"An instance no query has named for {forget_s / 60:g} min ({forget_s:g} s) is " \
           f"forgotten" in said
    assert f"at most {prometheus_source.MAX_INSTANCES:,} instances are known at once" in said
    assert f"default max(refresh interval, {DEFAULT_BACKFILL_STEP_S:g} s)" in said
    assert f"never more than {MAX_POINTS:,} points per series".replace(",", " ") in said
    assert f"An answer is read up to {MAX_ANSWER_BYTES / 2**20:g} MiB" in said
    assert (f"Answers over {OFF_LOOP_BYTES / 2**20:g} MiB are decoded, and results over "
            f"{OFF_LOOP_SERIES:,} series grouped per instance, in a worker thread") in said
    security = (REPO / "docs" / "security.md").read_text(encoding="utf-8").splitlines()
    (row,) = [line for line in security if line.startswith("| Prometheus series heads")]
    assert f"| {MAX_CACHED_HEADS:,} entries, {MAX_CACHED_HEAD_CHARS / 2**20:g} MiB of label" in row


SCRAPE_S = 3.0


LANDS_AFTER_S = 1.5  # a scrape is queryable this long after its timestamp (< INGEST_LAG_S)


class FakeAPI:
    """Two instances scraped every SCRAPE_S; `running` counts the scrapes."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.requests = 0
        self.values_sent = 0

    def _series(self, instance: str, at: float, span: float) -> dict[str, Any]:
        now = self.clock[0]
        stamps = [i * SCRAPE_S for i in range(1, int(now / SCRAPE_S) + 1)]
        values = [[t, str(t / SCRAPE_S)] for t in stamps
                  if at - span < t <= at and t + LANDS_AFTER_S <= now]
        self.values_sent += len(values)
        return {"metric": {"__name__": RUNNING, "job": "vllm", "instance": instance,
                           "model_name": "m", "engine": "0"}, "values": values}

    async def matrix(self, query: str, at: float) -> list[dict[str, Any]]:
        self.requests += 1
        span = int(re.search(r"\[(\d+)ms\]", query).group(1)) / 1000  # type: ignore[union-attr]
        if query.startswith("up"):
            return []
        return [self._series(instance, at, span) for instance in ("a:1", "b:1")]

    async def call(self, path: str, form: dict[str, str] | None = None, **_: Any) -> Any:
        return {"activeTargets": []}

    async def aclose(self) -> None:
        pass


async def test_refreshes_read_each_sample_once_including_late_ones() -> None:
    clock = [100.0]
    source = PrometheusSource(load_settings("prom:9090"), interval_s=1.0, lookback_s=30.0,
                              clock=lambda: clock[0])
    api = source.api = FakeAPI(clock)  # type: ignore[assignment]
    delivered: dict[str, list[float]] = {"a:1": [], "b:1": []}
    while clock[0] < 160.0:
        for scrape in await source.poll_once():
            assert scrape.ok, scrape.error
            delivered[scrape.target.name or ""].append(scrape.t)
        clock[0] += 1.3  # refreshes out of step with the scrapes
    # Every scrape that had landed by the last refresh, each exactly once, in order;
    # the first refresh went back lookback_s, to now (no earlier read to continue).
    expected = [t for t in (i * SCRAPE_S for i in range(1, 60))
                if 100.0 - 30.0 < t <= clock[0] - 1.3 - INGEST_LAG_S]
    for instance, times in delivered.items():
        assert times == expected[:len(times)], instance
        assert len(times) >= len(expected) - 1  # at most the newest is still to come
        assert times[0] == 72.0
    # Read once: only the first refresh's last INGEST_LAG_S (< one scrape) is read again.
    assert api.values_sent <= sum(len(times) for times in delivered.values()) + 2


def test_selector_matchers_are_merged_into_the_fleet_query() -> None:
    assert selector_matchers("") == ""
    assert selector_matchers(' {namespace="prod", pod=~"a.*",} ') == 'namespace="prod", pod=~"a.*"'
    query = vector_selector({"vllm:b", "vllm:a"}, '{namespace="prod"}')
    assert query == '{__name__=~"vllm:a|vllm:b", namespace="prod"}'
    for bad in ('namespace="prod"', '{__name__="up"}'):
        with pytest.raises(ValueError):
            selector_matchers(bad)


def test_series_become_one_scrape_per_instance_and_timestamp() -> None:
    result = [
        {"metric": {"__name__": "vllm:kv_cache_usage_perc", "job": "j", "instance": "a:1",
                    "model_name": 'm"x\\', "engine": "0"},
         "values": [[100.5, "0.25"], [101.5, "0.5"]]},
        {"metric": {"__name__": "vllm:num_requests_running", "job": "j", "instance": "a:1",
                    "model_name": 'm"x\\', "engine": "0"},
         "values": [[100.5, "3"]]},
        {"metric": {"__name__": "vllm:num_requests_running", "job": "j", "instance": "b:1",
                    "model_name": "m", "engine": "0"},
         "values": [[100.7, "NaN"]]},
    ]
    grouped = group_scrapes(result)
    assert set(grouped) == {("j", "a:1"), ("j", "b:1")}
    assert sorted(grouped["j", "a:1"]) == [100.5, 101.5]
    samples = Exposition(grouped["j", "a:1"][100.5])
    (engine,) = adapt(samples).engines
    assert (engine.model, engine.kv_usage, engine.running) == ('m"x\\', 0.25, 3.0)
    # Written out (snapshot files, recordings) they read back the same, escapes and all.
    assert read_exposition(to_text(samples)).engines == adapt(samples).engines
    (nan,) = grouped["j", "b:1"][100.7]
    assert nan.labels == {"model_name": "m", "engine": "0"} and nan.value != nan.value


def test_settings_reject_credentials_and_bad_selectors() -> None:
    settings = load_settings("prom:9090/", selector='{job="vllm"}')
    assert settings.url == "http://prom:9090"
    target = target_for(settings, "vllm", "10.0.0.1:8000")
    assert (target.url, target.label, target.group) == (
        "http://prom:9090#vllm/10.0.0.1:8000", "10.0.0.1:8000", "vllm")
    for url, selector in (("http://u:p@prom:9090", ""), ("prom:9090", "job=vllm")):
        with pytest.raises(ValueError):
            load_settings(url, selector=selector)


@pytest.mark.parametrize(("text", "seconds"), [
    ("15d", 15 * 86400), ("1w2d", 9 * 86400), ("2h30m", 9000), ("15d or 10GiB", 15 * 86400),
    ("10GiB", None), ("", None), ("banana", None), ("1y", 365 * 86400),
])
def test_prometheus_retention_is_read_from_its_runtime_info(text: str,
                                                            seconds: float | None) -> None:
    assert parse_retention(text) == seconds


# -- the caps, at their boundaries -------------------------------------------------------


async def test_an_instance_unseen_for_exactly_15_minutes_is_kept_and_a_hair_longer_forgotten(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 5, 1.0)]}
    clock = Clock()
    async with source(server, clock, lookback_s=60.0) as src:
        await src.discover()  # heard of at T0, never named again
        stored.scrapes = {}
        clock.now = T0 + prometheus_source.FORGET_AFTER_S
        [stale] = await src.poll_once()
        assert (stale.target.name, stale.failure) == (A, "bad_payload")
        assert [t.name for t in src.targets] == [A]
        clock.now = T0 + prometheus_source.FORGET_AFTER_S + 0.001
        assert await src.poll_once() == []
        assert src.targets == []


async def test_at_most_2048_instances_are_known_and_the_least_recently_heard_goes_first(
        prom: tuple[Stored, FaultServer]) -> None:
    assert prometheus_source.MAX_INSTANCES == 2048
    stored, server = prom
    fleet = [f"10.1.{i // 250}.{i % 250}:8000" for i in range(2048)]
    clock = Clock()
    async with source(server, clock, lookback_s=60.0) as src:
        stored.scrapes = {(JOB, A): [(T0 - 1, 1.0)]}
        await src.poll_once()  # A heard at T0
        clock.now = T0 + 5
        stored.scrapes = {(JOB, name): [(T0 + 4, 1.0)] for name in fleet[:-1]}
        await src.poll_once()  # 2,047 more at T0 + 5: 2,048 known, the cap, A kept
        assert len(src.targets) == 2048 and A in {t.name for t in src.targets}
        clock.now = T0 + 10
        stored.scrapes = {(JOB, fleet[-1]): [(T0 + 9, 1.0)]}
        await src.poll_once()  # one more: A, heard least recently, goes
    assert sorted(t.name for t in src.targets) == sorted(fleet)


async def test_past_the_cap_the_forgotten_go_then_the_least_recent_one_15_minutes_unseen_too(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    old, edge = "10.9.0.1:8000", "10.9.0.2:8000"
    fleet = [f"10.1.{i // 250}.{i % 250}:8000" for i in range(2048)]
    clock = Clock()
    async with source(server, clock, lookback_s=60.0) as src:
        stored.scrapes = {(JOB, old): [(T0 - 1, 1.0)]}
        await src.poll_once()  # old heard at T0
        clock.now = T0 + 0.5
        stored.scrapes = {(JOB, edge): [(T0 - 1.5, 1.0)]}
        await src.poll_once()  # edge heard at T0 + 0.5
        clock.now = T0 + 0.5 + prometheus_source.FORGET_AFTER_S
        stored.scrapes = {(JOB, name): [(clock.now - 2.5, 1.0)] for name in fleet}
        await src.poll_once()  # 2,050 known: old unseen 900.5 s, edge exactly 900 s
    assert sorted(t.name for t in src.targets) == sorted(fleet)


@pytest.mark.parametrize("values", [("0", "1"), ("1", "0")])
async def test_two_up_series_of_an_instance_at_one_moment_down_decides_in_any_order(
        prom: tuple[Stored, FaultServer], values: tuple[str, str]) -> None:
    """Two scrape jobs relabelled into one (job, instance): one scrape failed, one did not,
    at the same moment. The failure is reported (down), and not contradicted by a stale
    'up == 1 but no series' beside it, whichever series Prometheus lists first."""
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 60, 1.0)]}  # its series gone for a minute
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        stored.hostile["up"] = matrix(*(
            {"metric": labels(__name__="up", job=JOB, instance=A, scheme=scheme),
             "values": [[T0 - 5, value]]}
            for scheme, value in zip(("http", "https"), values, strict=True)))
        delivered = await src.poll_once()
    assert [(s.target.name, s.t, s.failure) for s in delivered] == [(A, T0 - 5, "down")]


@pytest.mark.parametrize("values", [("0", "1"), ("1", "0")])
async def test_two_up_series_seen_at_discovery_leave_the_instance_down_in_any_order(
        prom: tuple[Stored, FaultServer], values: tuple[str, str]) -> None:
    """The same two series, seen first by discovery: the instance is down (its failure
    was the newest news), not 'up == 1 but no series', whichever Prometheus lists first."""
    stored, server = prom
    stored.scrapes = {(JOB, A): [(T0 - 60, 1.0)]}
    stored.hostile["up"] = matrix(*(
        {"metric": labels(__name__="up", job=JOB, instance=A, scheme=scheme),
         "values": [[T0 - 5, value]]}
        for scheme, value in zip(("http", "https"), values, strict=True)))
    async with source(server, Clock(), lookback_s=60.0) as src:
        await src.discover()
        [entry] = src._instances.values()
        assert (entry.up_t, entry.up) == (T0 - 5, False)
        delivered = await src.poll_once()
    assert [(s.target.name, s.t, s.failure) for s in delivered] == [(A, T0 - 5, "down")]
