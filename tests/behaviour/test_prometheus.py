"""Reading the fleet through a Prometheus, as the app and ``kvtop check --prometheus`` rely on
it (docs/prometheus.md), from a fake Prometheus API on 127.0.0.1 that stores scrapes with
their timestamps and answers kvtop's queries over them: which instances are found, one
scrape per instance and timestamp in time order, each stored sample read once, a down
instance with Prometheus's own reason, a stale one named so, the backfill's span and step,
and Prometheus's refusals (a token, its errors) said plainly with the token masked."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs

import pytest

from kvtop.collect.prometheus import (
    DEFAULT_BACKFILL_STEP_S,
    INGEST_LAG_S,
    MAX_POINTS,
    PrometheusError,
    PrometheusSource,
    load_settings,
    parse_retention,
)
from kvtop.collect.target import Scrape, Secret
from tests.faultserver import FaultServer, Request, mode

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
    queries: list[dict[str, str]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def respond(self, request: Request) -> tuple[int, bytes]:
        self.headers.append(request.headers)
        if self.refuse is not None:
            return self.refuse
        form = {k: v[-1] for k, v in parse_qs(request.body.decode()).items()}
        self.queries.append({"path": request.path, **form})
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
        if request.path.endswith("/query_range"):
            return self._matrix(float(form["start"]) - 0.001, float(form["end"]), query)
        at = float(form["time"])
        if query.startswith("count by"):
            return ok({"resultType": "vector", "result": [
                {"metric": labels(job=job, instance=instance), "value": [at, "1"]}
                for job, instance in self.scrapes]})
        span = int(re.search(r"\[(\d+)ms\]", query).group(1)) / 1000  # type: ignore[union-attr]
        if query.startswith("up"):
            return ok({"resultType": "matrix", "result": [
                {"metric": labels(__name__="up", job=job, instance=instance),
                 "values": [[t, v] for t, v in samples if at - span < t <= at]}
                for (job, instance), samples in self.up.items()]})
        return self._matrix(at - span, at, query)

    def _matrix(self, after: float, until: float, query: str) -> tuple[int, bytes]:
        assert RUNNING in query
        return ok({"resultType": "matrix", "result": [
            {"metric": labels(__name__=RUNNING, job=job, instance=instance, model_name="m",
                              engine="0"),
             "values": [[t, repr(v)] for t, v in samples if after < t <= until]}
            for (job, instance), samples in self.scrapes.items()]})


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


# -- finding the fleet ---------------------------------------------------------------------


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
    stored.up = {(JOB, A): [(T0 - 5, "1")], (JOB, B): [(T0 - 20, "0"), (T0 - 5, "0")],
                 (JOB, "node-exporter:9100"): [(T0 - 5, "1")]}
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


# -- refreshes -----------------------------------------------------------------------------


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
    assert all(f'job=~"{JOB}"' in q for q in queries if q.startswith("up"))


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


# -- the backfill --------------------------------------------------------------------------


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
        prom: tuple[Stored, FaultServer]) -> None:
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
    ("10GiB", None), ("", None), ("15x", None),
])
def test_retention_as_prometheus_writes_it(text: str, seconds: float | None) -> None:
    assert parse_retention(text) == seconds


@pytest.mark.parametrize(("url", "base"), [
    ("prom:9090", "http://prom:9090"), (" https://prom/prefix/ ", "https://prom/prefix"),
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


# -- Prometheus's own scrape errors ---------------------------------------------------------


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


async def test_a_token_echoed_in_json_escapes_is_masked_in_what_is_quoted(
        prom: tuple[Stored, FaultServer]) -> None:
    stored, server = prom
    token = Secret("s3cret-token")
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
            patch.setattr("kvtop.collect.prometheus.group_scrapes", planted)
            [failed] = await src.poll_once()
        assert (failed.failure, failed.error) == (
            "bad_payload", "kvtop could not read Prometheus's answer (KeyError); a bug in "
                           "kvtop, please report it")
        assert "reading a Prometheus answer failed" in caplog.text and "a bug" in caplog.text
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
