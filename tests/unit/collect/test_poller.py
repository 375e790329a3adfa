"""The poller against a real local HTTP server that injects faults.

What a scrape says about an answer that is not metrics text, from a real server on
127.0.0.1: an HTML page (by its content type, whatever it starts with) and binary data
(NUL bytes, as protobuf and compressed files have) are named as what they are.

Narrowed reads: the poller asks a server for only the samples kvtop reads (``name[]`` at
``/metrics/``), and reads the URL as given wherever that does not work."""

from __future__ import annotations

import asyncio
import functools
import gzip
import itertools
import json
import logging
import math
import random
import re
import socket
import ssl
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from kvtop import __version__
from kvtop.collect import http
from kvtop.collect import poller as poller_module
from kvtop.collect.adapters import WANTED, read_exposition, vllm
from kvtop.collect.http import (
    HINT_401_NO_TOKEN,
    HINT_401_TOKEN,
    Failed,
    classify_exception,
    make_session,
    read_version,
    scrape,
    verified_context,
    version_url,
)
from kvtop.collect.poller import OFF_LOOP_CHARS, Gate, Poller, backoff_delay, narrowed_url
from kvtop.collect.target import MASK, Scrape, Secret, Target
from kvtop.sim.server import SimConfig, SimFleet
from tests.fakes.faultserver import BIG_BYTES, FaultServer, closed_port, fixture, mode
from tests.scenarios import bodies
from tests.support.paths import REPO
from tests.support.waiting import DEADLINE_S, eventually

TIMEOUT = 0.6


# What a loaded 2-core machine may add to a deadline that is kept: scheduling, not waiting
# on the server. A scrape without a deadline waits on a hung or dribbling server for
# minutes, so a bound of the deadline plus this still tells the two apart.
LOADED_SLACK_S = 5.0


FIXTURE_TEXT = fixture().decode()


@mode("echo500")
async def _echo500(srv: FaultServer, req, w) -> bool:  # type: ignore[no-untyped-def]
    """A 500 whose body repeats the Authorization header, as careless servers do."""
    body = f"bad request: {req.headers.get('authorization')}".encode()
    return await srv.respond(w, 500, body)


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with make_session() as c:
        yield c


async def timed_scrape(client: aiohttp.ClientSession, url: str, *,
                       timeout_s: float = TIMEOUT, **kw: object) -> Scrape:
    started = time.perf_counter()
    reading = scrape(client, Target(url), timeout_s=timeout_s, **kw)  # type: ignore[arg-type]
    result = await asyncio.wait_for(reading, DEADLINE_S)
    elapsed = time.perf_counter() - started
    assert elapsed < timeout_s + LOADED_SLACK_S, f"{url} took {elapsed:.2f} s"
    assert result.duration_s <= elapsed
    return result


OK_MODES = ["ok", "gzip", "redirect", "slow"]


@pytest.mark.parametrize("name", OK_MODES)
async def test_healthy_answers_are_read_whole(
    client: aiohttp.ClientSession, fault_server: FaultServer, name: str
) -> None:
    result = await timed_scrape(client, fault_server.url(name, "s=0.1" if name == "slow" else ""))
    assert result.ok, result.error
    assert result.body == FIXTURE_TEXT
    assert result.failure is None and result.error is None
    assert result.duration_s > 0 and result.t <= time.time()


FAULTS = [
    # mode, query, kind, words the error must contain
    ("hang", "", "timeout", "0.6 s"),
    ("slow", "s=3", "timeout", "no complete answer"),
    ("dribble", "s=0.02", "timeout", "no complete answer"),  # total deadline, not per read
    ("auth", "", "auth", "token_env"),
    ("forbidden", "", "auth", "HTTP 403"),
    ("error500", "", "down", "HTTP 500"),
    ("loading", "", "down", "Loading model"),
    ("reset", "", "down", "closed the connection"),
    ("notfound", "", "bad_payload", "--enable-metrics"),
    ("nometrics", "", "bad_payload", "--metrics"),
    ("redirect_loop", "", "bad_payload", "redirect"),
    ("garbage", "", "bad_payload", "not"),
    ("latin1", "", "bad_payload", "UTF-8"),
    ("json", "", "bad_payload", "not Prometheus text"),
    ("html", "", "bad_payload", "HTML"),
    ("empty", "", "bad_payload", "empty"),
    ("truncated", "", "bad_payload", "cut short"),
    ("big", "", "bad_payload", "cap"),
    ("big_unannounced", "", "bad_payload", "cap"),
    ("gzip_bomb", "", "bad_payload", "cap"),
]


# Reading up to the 16 MB cap is work a loaded machine may stretch past 0.6 s (then it
# would read "timeout"): these get a deadline the cap must beat by far.
CAPPED = {"big", "big_unannounced", "gzip_bomb"}


@pytest.mark.parametrize(("name", "query", "kind", "words"), FAULTS, ids=[f[0] for f in FAULTS])
async def test_each_fault_is_classified_in_bounded_time(
    client: aiohttp.ClientSession,
    fault_server: FaultServer,
    name: str,
    query: str,
    kind: str,
    words: str,
) -> None:
    timeout_s = 10 * TIMEOUT if name in CAPPED else TIMEOUT
    result = await timed_scrape(client, fault_server.url(name, query), timeout_s=timeout_s)
    assert result.failure == kind, result.error
    assert result.body is None and not result.ok
    assert words in (result.error or ""), result.error
    assert "Traceback" not in (result.error or "")


async def test_auth_error_says_where_the_token_goes(
    client: aiohttp.ClientSession, fault_server: FaultServer
) -> None:
    result = await timed_scrape(client, fault_server.url("auth"))
    assert result.error == HINT_401_NO_TOKEN


async def test_refused_port_is_down(client: aiohttp.ClientSession) -> None:
    result = await timed_scrape(client, f"http://127.0.0.1:{closed_port()}/metrics")
    assert result.failure == "down"
    assert "refused" in (result.error or "")


async def test_unknown_host_is_down(client: aiohttp.ClientSession) -> None:
    # The poller's table: a DNS failure is "down" (a timeout is a server that does not
    # answer). .invalid never resolves (RFC 6761); the deadline leaves any resolver time to
    # say so.
    result = await scrape(client, Target("http://kvtop-no-such-host.invalid:8000/metrics"),
                          timeout_s=30.0)
    assert (result.failure, result.error) == ("down", "DNS lookup failed: unknown host")


async def test_bad_url_never_raises(client: aiohttp.ClientSession) -> None:
    result = await scrape(client, Target("ftp://127.0.0.1:1/metrics"), timeout_s=TIMEOUT)
    assert result.failure == "down" and result.error


@pytest.mark.parametrize("name", ["big_unannounced", "gzip_bomb"])
async def test_a_huge_body_is_dropped_without_being_buffered(
    fault_server: FaultServer, name: str
) -> None:
    cap = 1024 * 1024
    async with make_session() as c:
        await scrape(c, Target(fault_server.url("ok")), timeout_s=2.0)  # warm the pool
        fault_server.bytes_sent = 0
        tracemalloc.start()
        try:
            result = await scrape(c, Target(fault_server.url(name)), timeout_s=5.0, max_bytes=cap)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert result.failure == "bad_payload" and "cap" in (result.error or "")
    assert peak < 4 * cap, f"peak {peak:,} bytes while reading"
    assert fault_server.bytes_sent < BIG_BYTES // 4  # the server was cut off early


async def test_content_length_over_the_cap_is_refused_before_reading(
    fault_server: FaultServer,
) -> None:
    async with make_session() as c:
        result = await scrape(c, Target(fault_server.url("big")), timeout_s=2.0)
    assert result.failure == "bad_payload"
    assert "Content-Length 52,428,800" in (result.error or "")
    assert fault_server.bytes_sent < BIG_BYTES // 4


async def test_a_body_just_under_the_cap_is_read(fault_server: FaultServer) -> None:
    size = len(fixture())
    async with make_session() as c:
        exact = await scrape(c, Target(fault_server.url("gzip")), timeout_s=2.0, max_bytes=size)
        under = await scrape(c, Target(fault_server.url("gzip")), timeout_s=2.0,
                             max_bytes=size - 1)
    assert exact.ok
    assert under.failure == "bad_payload"


async def test_the_token_goes_in_a_header_and_nowhere_else() -> None:
    secret = "s3cret-t0ken-value"
    async with FaultServer(mode="auth", token=secret) as srv, make_session() as c:
        good = Target(srv.url(), token=Secret(secret))
        wrong = Target(srv.url(), token=Secret("not-it"))
        echo = Target(srv.url("echo500"), token=Secret(secret))
        results = [await scrape(c, t, timeout_s=2.0) for t in (good, wrong, echo)]
    assert results[0].ok and results[0].body == FIXTURE_TEXT
    assert results[1].failure == "auth" and results[1].error == HINT_401_TOKEN
    assert results[2].failure == "down"
    assert srv.requests[0].headers["authorization"] == f"Bearer {secret}"
    for result in results:
        shown = " ".join(
            [
                repr(result),
                str(result),
                repr(result.target),
                result.error or "",
                result.version or "",
            ]
        )
        assert secret not in shown
        assert "not-it" not in shown


async def test_no_token_no_authorization_header(fault_server: FaultServer) -> None:
    async with make_session() as c:
        await scrape(c, Target(fault_server.url()), timeout_s=2.0)
    assert "authorization" not in fault_server.requests[0].headers


async def test_version_is_read_once_and_again_after_a_failure(fault_server: FaultServer) -> None:
    def version_hits() -> int:
        return sum(r.path.endswith("/version") for r in fault_server.requests)

    target = Target(fault_server.url())
    async with Poller([target], timeout_s=2.0) as poller:
        first = (await poller.poll_once())[0]
        second = (await poller.poll_once())[0]
        assert first.version == second.version == "0.33.0"
        assert version_hits() == 1
        fault_server.mode = "error500"
        failed = (await poller.poll_once())[0]
        assert failed.failure == "down" and failed.version is None
        fault_server.mode, fault_server.version = "ok", "0.34.1"  # upgraded while down
        back = (await poller.poll_once())[0]
        assert back.ok and back.version == "0.34.1"
        assert version_hits() == 2


VERSION_ANSWERS = [
    (None, None),  # no version: /version is a 404
    (b'{"version": "0.9.2"}', "0.9.2"),
    (b'{"version": 3}', None),
    (b'["0.9.2"]', None),
    (b"\xff\x00 not json", None),
    (b'{"version": "' + b"9" * 100_000 + b'"}', None),  # over the /version size cap
]


@pytest.mark.parametrize(("body", "expected"), VERSION_ANSWERS)
async def test_version_tolerates_404_and_garbage(body: bytes | None, expected: str | None) -> None:
    async with FaultServer(version=None, version_body=body) as srv, make_session() as c:
        assert await read_version(c, Target(srv.url())) == expected


async def test_version_of_a_dead_or_hung_server_is_none() -> None:
    async with make_session() as c:
        assert await read_version(c, Target(f"http://127.0.0.1:{closed_port()}")) is None
        async with FaultServer(version_mode="hang") as srv:
            started = time.perf_counter()
            version = await asyncio.wait_for(read_version(c, Target(srv.url()), timeout_s=0.3),
                                             DEADLINE_S)
            elapsed = time.perf_counter() - started
            assert [r.path for r in srv.requests] == ["/version"]  # asked, and never answered
    assert version is None
    assert elapsed < 0.3 + LOADED_SLACK_S


def test_version_url_keeps_a_path_prefix() -> None:
    assert version_url(Target.from_spec("h:8000")) == "http://h:8000/version"
    assert version_url(Target("https://h/vllm/a/metrics")) == "https://h/vllm/a/version"
    assert version_url(Target("http://h:9/custom")) == "http://h:9/version"


async def test_poll_once_reads_healthy_targets_while_one_hangs(fault_server: FaultServer) -> None:
    targets = [
        Target(fault_server.url("hang")),
        Target(fault_server.url("ok")),
        Target(f"http://127.0.0.1:{closed_port()}/metrics"),
        Target(fault_server.url("gzip")),
    ]
    async with Poller(targets, timeout_s=TIMEOUT) as poller:
        started = time.perf_counter()
        results = await poller.poll_once()
        elapsed = time.perf_counter() - started
    assert [r.target for r in results] == targets
    assert [r.failure for r in results] == ["timeout", None, "down", None]
    assert results[1].body == results[3].body == FIXTURE_TEXT
    hung = results[0]
    # all read at once: the others started before the hung one's deadline, not after it
    assert all(r.t < hung.t + TIMEOUT for r in results[1:])
    assert elapsed < TIMEOUT + LOADED_SLACK_S


async def test_run_keeps_healthy_targets_on_time_beside_a_dead_one(
    fault_server: FaultServer,
) -> None:
    hang, ok = Target(fault_server.url("hang")), Target(fault_server.url("ok"))
    seen: dict[Target, list[Scrape]] = {hang: [], ok: []}
    stop = asyncio.Event()

    def on_scrape(s: Scrape) -> None:
        seen[s.target].append(s)
        if len(seen[ok]) == 8:
            stop.set()

    # The hung attempt's deadline is far off: every healthy read must fit inside it.
    async with Poller([hang, ok], interval_s=0.1, timeout_s=DEADLINE_S / 2) as poller:
        await asyncio.wait_for(poller.run(on_scrape, stop=stop), DEADLINE_S)
    assert seen[hang] == []  # still waiting on its first attempt
    assert all(s.ok for s in seen[ok])


async def test_async_callback_and_a_failing_callback_do_not_stop_polling(
    fault_server: FaultServer,
) -> None:
    calls: list[Scrape] = []

    stop = asyncio.Event()

    async def on_scrape(s: Scrape) -> None:
        calls.append(s)
        await asyncio.sleep(0)
        if len(calls) == 4:
            stop.set()
        raise RuntimeError("consumer bug")

    async with Poller([Target(fault_server.url())], interval_s=0.05) as poller:
        await asyncio.wait_for(poller.run(on_scrape, stop=stop), DEADLINE_S)
    assert len(calls) == 4


def test_backoff_doubles_to_the_cap_and_never_undercuts_the_interval() -> None:
    delays = [backoff_delay(n, 1.0, 30.0) for n in range(8)]
    assert delays == [1.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff_delay(1, 1.0, 30.0, jitter=0.8) == 1.0
    assert backoff_delay(3, 1.0, 30.0, jitter=1.2) == pytest.approx(4.8)
    assert backoff_delay(9, 1.0, 30.0, jitter=1.2) == 30.0
    assert backoff_delay(3, 60.0, 30.0) == 60.0  # an interval above the cap wins
    assert backoff_delay(10_000, 1.0, 30.0) == 30.0


async def test_backoff_grows_for_a_failing_target_and_resets_on_recovery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    interval, cap = 0.05, 0.5  # 0.05: the shortest interval a poller takes
    planned: list[tuple[int, float]] = []  # (failures so far, delay) after each attempt

    def spy(failures: int, interval_s: float, max_backoff_s: float, jitter: float = 1.0) -> float:
        delay = backoff_delay(failures, interval_s, max_backoff_s, jitter)
        planned.append((failures, delay))
        return delay

    monkeypatch.setattr(poller_module, "backoff_delay", spy)
    attempts: list[Scrape] = []
    stop = asyncio.Event()
    # The schedule counts from an attempt's start, which for the first includes making the
    # session (its TLS context: ~0.1 s, once a process); a Scrape's t is its request's start.
    verified_context()
    async with FaultServer(mode="error500") as srv:

        def on_scrape(s: Scrape) -> None:
            attempts.append(s)
            if len(attempts) == 5:
                srv.mode = "ok"  # the server comes back before attempt 6
            if len(attempts) == 8:
                stop.set()

        target = Target(srv.url())
        async with Poller([target], interval_s=interval, max_backoff_s=cap, seed=1) as poller:
            await asyncio.wait_for(poller.run(on_scrape, stop=stop), DEADLINE_S)
            assert poller.state(target).failures == 0
    assert [s.ok for s in attempts] == [False] * 5 + [True] * 3
    assert [failures for failures, _ in planned] == [1, 2, 3, 4, 5, 0, 0, 0]
    delays = [delay for _, delay in planned]
    # after failures 1..5: the interval, 2x and 4x it (x0.8..1.2 jitter), then the cap
    assert delays[0] == interval
    assert 0.8 * 2 * interval <= delays[1] <= 1.2 * 2 * interval
    assert 0.8 * 4 * interval <= delays[2] <= 1.2 * 4 * interval
    assert 0.8 * 8 * interval <= delays[3] <= cap == delays[4]  # 16x would be 0.64 at least
    assert delays[5:] == [interval] * 3  # healthy again: back to the interval
    # and each attempt waited at least its planned delay (a loaded machine only adds)
    for (before, after), delay in zip(itertools.pairwise(attempts), delays, strict=False):
        assert after.t - before.t >= delay - 0.01, (after.t - before.t, delay)


async def test_interval_change_takes_effect_at_once(fault_server: FaultServer) -> None:
    times: list[float] = []
    stop = asyncio.Event()
    async with Poller([Target(fault_server.url())], interval_s=10.0) as poller:

        def on_scrape(s: Scrape) -> None:
            times.append(time.perf_counter())
            if len(times) == 1:
                asyncio.get_running_loop().call_later(0.1, setattr, poller, "interval_s", 0.05)
            if len(times) == 4:
                stop.set()

        await asyncio.wait_for(poller.run(on_scrape, stop=stop), DEADLINE_S)
    assert times[-1] - times[0] < 10.0 / 2  # woken at once, not at the end of the 10 s sleep
    assert poller.timeout_s == 2.0  # the default follows the interval, floored at 2 s


async def test_targets_can_be_added_and_removed_while_running(fault_server: FaultServer) -> None:
    first, second = Target(fault_server.url("ok")), Target(fault_server.url("gzip"))
    seen: list[Target] = []
    stop = asyncio.Event()
    async with Poller([first], interval_s=0.05) as poller:

        def on_scrape(s: Scrape) -> None:
            seen.append(s.target)
            if len(seen) == 2:
                poller.add_target(second)
                poller.remove_target(first)
            if seen.count(second) == 3:
                stop.set()

        await asyncio.wait_for(poller.run(on_scrape, stop=stop), DEADLINE_S)
        assert poller.targets == (second,)
    assert seen[-1] == second and seen.count(first) <= 3


async def test_a_counter_reset_between_two_scrapes_is_served_as_is() -> None:
    before, after = fixture("vllm-0.33.0-v1-twin-idle.txt"), fixture()
    async with FaultServer(bodies=[before, after]) as srv, Poller([Target(srv.url())]) as poller:
        one, two = (await poller.poll_once())[0], (await poller.poll_once())[0]
    assert one.body == before.decode() and two.body == after.decode()
    assert "vllm:num_preemptions_total{" in one.body
    assert "} 68.0" in one.body and "} 6.0" in two.body


def test_a_poller_without_targets_or_with_a_bad_interval() -> None:
    with pytest.raises(ValueError):
        Poller([], interval_s=0)
    with pytest.raises(ValueError):
        Poller([], interval_s=float("nan"))


async def test_poll_once_with_no_targets_is_empty() -> None:
    async with Poller([]) as poller:
        assert await poller.poll_once() == []


async def test_a_duplicate_target_gets_one_result_per_entry(fault_server: FaultServer) -> None:
    target = Target(fault_server.url())
    async with Poller([target, target]) as poller:
        results = await poller.poll_once()
    assert [r.target for r in results] == [target, target]
    assert all(r.ok for r in results)


async def test_tls_is_verified_unless_insecure(self_signed: ssl.SSLContext) -> None:
    async with FaultServer(ssl_context=self_signed) as srv:
        url = srv.url().replace("http://", "https://")
        async with make_session() as strict:
            refused = await scrape(strict, Target(url), timeout_s=2.0)
        async with make_session(insecure=True) as lax:
            accepted = await scrape(lax, Target(url), timeout_s=2.0)
    assert refused.failure == "down" and "--insecure" in (refused.error or "")
    assert accepted.ok and accepted.body == FIXTURE_TEXT


LOGIN = b"Please sign in to continue.\n<form method=post><input name=user></form>\n"


# a protobuf-delimited MetricFamily: printable bytes with NULs among them
PROTOBUF = b"\x1a\n\x18vllm:num_requests_running\x18\x01\"\x08\x12\x00\x00\x00\x00\x00\n"


@mode("html_text_first")
async def _html_text_first(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    return await srv.respond(w, 200, LOGIN, content_type="TEXT/HTML; charset=utf-8")


@mode("metrics_after_html")
async def _metrics_after_html(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    return await srv.respond(w, 200, b"  \n<html><body>proxy error</body></html>")


@mode("protobuf")
async def _protobuf(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    return await srv.respond(w, 200, PROTOBUF, content_type="application/vnd.google.protobuf")


@mode("nul_in_text")
async def _nul_in_text(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    return await srv.respond(w, 200, b"vllm:num_requests_running 1.0\n\x00\x00\x00\x00")


async def read(client: aiohttp.ClientSession, name: str) -> Scrape:
    async with FaultServer() as server:
        return await scrape(client, Target(server.url(name)), timeout_s=10)


HTML_PAGE = "an HTML page, not metrics (a login page, proxy or web UI at this URL?)"


async def test_an_html_page_is_named_by_its_content_type(client: aiohttp.ClientSession) -> None:
    result = await read(client, "html_text_first")
    assert result.failure == "bad_payload" and not result.ok
    assert result.error == HTML_PAGE


async def test_an_html_page_is_named_by_its_first_tag(client: aiohttp.ClientSession) -> None:
    result = await read(client, "metrics_after_html")  # served as text/plain
    assert (result.failure, result.error) == ("bad_payload", HTML_PAGE)


@pytest.mark.parametrize("name", ["protobuf", "nul_in_text"])
async def test_binary_data_is_named_as_binary(client: aiohttp.ClientSession, name: str) -> None:
    result = await read(client, name)
    assert result.failure == "bad_payload" and not result.ok
    assert result.error == "binary data, not Prometheus text"


def raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    """``exc`` as a library raises it: thrown, with its cause and context chained."""
    try:
        try:
            if cause is not None:
                raise cause
        except BaseException as inner:  # chained below, as aiohttp does
            raise exc from inner
        raise exc
    except BaseException as thrown:
        return thrown


UNTRUSTED = ("TLS certificate not trusted (self-signed certificate); pass --insecure to skip "
             "verification or point SSL_CERT_FILE at your CA")


VERIFY = ssl.SSLCertVerificationError(
    1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate "
       "(_ssl.c:1006)")


WRONG_VERSION = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")


NAMED = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")


NAMED.reason = "WRONG_VERSION_NUMBER"  # as OpenSSL's errors come: the reason on its own


METRICS_URL = URL("http://gpu-1:8000/metrics")


REQUEST = aiohttp.RequestInfo(METRICS_URL, "GET", CIMultiDictProxy(CIMultiDict()), METRICS_URL)


@pytest.mark.parametrize(("exc", "kind", "reason"), [
    (aiohttp.TooManyRedirects(None, ()), "bad_payload", "redirect loop: too many redirects"),
    (VERIFY, "down", UNTRUSTED),
    (raised(aiohttp.ClientConnectionError("cannot connect"), VERIFY), "down", UNTRUSTED),
    (ssl.SSLCertVerificationError(  # as a wrapper quotes it: no "(_ssl.c", then ')]
        1, "[SSLCertVerificationError: (1, 'certificate verify failed: self-signed "
           "certificate')]"), "down", UNTRUSTED),
    (WRONG_VERSION, "down", "TLS handshake failed ([SSL: WRONG_VERSION_NUMBER] wrong version "
                            "number); does the server speak https?"),
    (NAMED, "down", "TLS handshake failed (WRONG_VERSION_NUMBER); does the server speak https?"),
    (socket.gaierror(-2, "Name or service not known"), "down",
     "DNS lookup failed: unknown host"),
    (ConnectionRefusedError(111, "Connection refused"), "down",
     "connection refused: nothing listens on that port"),
    (asyncio.TimeoutError(), "timeout", "no complete answer"),
    (aiohttp.ServerDisconnectedError(), "down",
     "the server closed the connection without answering"),
    (raised(aiohttp.ClientOSError(104, "reset"), ConnectionResetError(104, "reset")), "down",
     "connection reset by the server"),
    (aiohttp.InvalidURL("ftp://x"), "down", "unsupported URL: ftp://x"),
    (aiohttp.ClientResponseError(None, (), message="Invalid header"), "down",  # type: ignore[arg-type]
     "broken HTTP answer: Invalid header"),
    (aiohttp.ClientConnectorError(None, OSError(113, "No route to host")), "down",  # type: ignore[arg-type]
     "cannot connect: No route to host"),
    (aiohttp.ClientConnectorError(None, OSError("no route")), "down",  # type: ignore[arg-type]
     "cannot connect: no route"),  # an OSError without an errno: its text
    (aiohttp.ClientResponseError(REQUEST, (), status=400, message=""), "down",
     "broken HTTP answer: 400, message='', url='http://gpu-1:8000/metrics'"),
    (ssl.SSLCertVerificationError(1, "certificate has expired"), "down",  # as a wrapper words it
     UNTRUSTED.replace("self-signed certificate", "certificate has expired")),
    (ssl.SSLCertVerificationError(1, "certificate verify failed: X509 chain too long"), "down",
     UNTRUSTED.replace("self-signed certificate", "X509 chain too long")),  # quoted whole
    (ValueError("odd \n  text"), "down", "cannot read the server: odd text"),
    (ValueError(), "down", "cannot read the server: ValueError"),
    (ValueError("x" * 300), "down", "cannot read the server: " + "x" * 200),
    (raised(RuntimeError("outer"), ValueError("inner")), "down",
     "cannot read the server: inner"),
])
def test_a_failure_is_named_by_the_most_telling_error_in_its_chain(
        exc: BaseException, kind: str, reason: str) -> None:
    assert classify_exception(exc) == (kind, reason)


def test_a_cause_hidden_on_purpose_or_too_deep_is_not_what_is_named() -> None:
    hidden = raised(ValueError("odd"), ConnectionRefusedError())
    hidden.__cause__, hidden.__suppress_context__ = None, True  # raise ... from None
    assert classify_exception(hidden) == ("down", "cannot read the server: odd")
    deep: BaseException = ConnectionRefusedError()
    for depth in range(8):  # the refusal is the 9th in the chain: past what is read
        deep = raised(ValueError(f"wrapper {depth}"), deep)
    assert classify_exception(deep) == ("down", "cannot read the server: wrapper 0")
    try:  # raised while handling another, without `from`: the context counts
        try:
            raise ConnectionResetError(104, "reset")
        except ConnectionResetError:
            raise aiohttp.ClientOSError(104, "write failed")  # noqa: B904 - as aiohttp does
    except aiohttp.ClientOSError as implicit:
        assert classify_exception(implicit) == ("down", "connection reset by the server")


def test_a_timeout_says_how_long_was_waited() -> None:
    assert classify_exception(asyncio.TimeoutError(), 2.5) == (
        "timeout", "no complete answer within 2.5 s")
    assert classify_exception(raised(aiohttp.ClientError("x"), TimeoutError()), 10.0) == (
        "timeout", "no complete answer within 10 s")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_an_error_that_cannot_be_printed_is_named_by_its_type() -> None:
    assert classify_exception(Unprintable()) == (
        "down", "cannot read the server: Unprintable")


TEXT = fixture()


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def flipped(data: bytes, at: int) -> bytes:
    """``data`` with the byte at ``at`` inverted (a checksum that no longer matches)."""
    broken = bytearray(data)
    broken[at] ^= 0xFF
    return bytes(broken)


ENCODED = {  # name -> (body, Content-Encoding) served by mode "encoded"
    "gzip": (gzip.compress(TEXT), "gzip"),
    "x-gzip": (gzip.compress(TEXT), "x-gzip"),
    "gzip, spaced and capitalised": (gzip.compress(TEXT), " GZip "),
    "deflate": (zlib.compress(TEXT), "deflate"),
    "identity": (TEXT, "identity"),
    "Identity": (TEXT, "Identity"),
    "raw deflate": (raw_deflate(TEXT), "deflate"),
    "zlib said to be gzip": (zlib.compress(TEXT), " X-GZIP"),
    "gzip with a bad CRC": (flipped(gzip.compress(TEXT), -8), "gzip"),
    "deflate with a bad checksum": (flipped(zlib.compress(TEXT), -1), "deflate"),
    "gzip cut short": (gzip.compress(TEXT)[: len(gzip.compress(TEXT)) // 2], "gzip"),
    # RFC 1952: a body of several members, as `gzip -d` reads it (the second was dropped)
    "gzip of two members": (gzip.compress(TEXT[:1000]) + gzip.compress(TEXT[1000:]), "gzip"),
    "gzip of three members, the last empty": (
        gzip.compress(TEXT[:7]) + gzip.compress(TEXT[7:]) + gzip.compress(b""), "gzip"),
    "gzip, trailing zeros": (gzip.compress(TEXT) + b"\0" * 8, "gzip"),
    "deflate, then a gzip member": (zlib.compress(TEXT) + gzip.compress(b"x"), "deflate"),
    "gzip, then a bomb as a second member": (
        gzip.compress(TEXT) + gzip.compress(b"\0" * (4 << 20)), "gzip"),
    "brotli": (b"\x1b\x03\x00\xf8\xa5\x40\x02", "br"),
    "a hostile encoding": (TEXT, "x" * 100),
}


@mode("encoded")
async def _encoded(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    body, encoding = ENCODED[req.query["as"]]
    return await srv.respond(w, 200, body, headers={"Content-Encoding": encoding})


async def read_encoded(name: str, **kw: Any) -> Scrape:
    async with FaultServer() as server, make_session() as client:
        url = server.url("encoded", urlencode({"as": name}))
        return await scrape(client, Target(url), timeout_s=DEADLINE_S, **kw)


@pytest.mark.parametrize("name", ["gzip", "x-gzip", "gzip, spaced and capitalised", "deflate",
                                  "identity", "Identity", "gzip of two members",
                                  "gzip of three members, the last empty",
                                  "gzip, trailing zeros"])
async def test_a_body_in_any_encoding_kvtop_asks_for_or_accepts_is_read_whole(name: str) -> None:
    result = await read_encoded(name)
    assert result.ok, result.error
    assert result.body == TEXT.decode()


DATA_CHECK = "Error -3 while decompressing data: incorrect data check"


@pytest.mark.parametrize(("name", "reason"), [
    ("raw deflate", "raw deflate data: 'Content-Encoding: deflate' must be zlib-wrapped "
                    "(RFC 9110), and this body has no zlib header"),
    ("zlib said to be gzip", "not gzip data, though the server says 'Content-Encoding: x-gzip'"),
    ("gzip with a bad CRC", f"corrupt gzip data ({DATA_CHECK})"),
    ("deflate with a bad checksum", f"corrupt deflate data ({DATA_CHECK})"),
    ("gzip cut short", "response cut short: the compressed body ended early"),
    ("brotli", "unsupported Content-Encoding 'br'"),
    ("deflate, then a gzip member", "corrupt deflate data (data after the end of the stream)"),
    ("a hostile encoding", f"unsupported Content-Encoding {'x' * 40!r}"),
])
async def test_a_body_that_cannot_be_decoded_says_why(name: str, reason: str) -> None:
    result = await read_encoded(name)
    assert (result.failure, result.error) == ("bad_payload", reason)
    assert result.body is None


@pytest.mark.parametrize("name", ["gzip", "gzip of two members",
                                  "gzip, then a bomb as a second member"])
async def test_a_decoded_body_over_the_cap_is_dropped_with_the_cap_named(name: str) -> None:
    result = await read_encoded(name, max_bytes=len(TEXT) - 1)  # sent small, decoded over
    assert (result.failure, result.error) == (
        "bad_payload", f"the body is over the {len(TEXT) - 1:,}-byte size cap; dropped "
                       "(a guard against broken or hostile servers)")


CAP = 4 * 1024 * 1024


@functools.lru_cache(maxsize=1)
def text_then_bomb() -> bytes:
    """gzip of 3.5 MiB of metrics text (random values: ~1.5 MB compressed, so it arrives in
    many pieces), then 32 MiB of zeros (~100 KB compressed)."""
    rng, lines, size = random.Random(0), [], 0
    while size < CAP * 7 // 8:
        lines.append(f'vllm:num_requests_running{{engine="{len(lines) % 8}"}} {rng.random()!r}\n')
        size += len(lines[-1])
    packer = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * (1 << 20)
    return (packer.compress("".join(lines).encode())
            + b"".join(packer.compress(zeros) for _ in range(32)) + packer.flush())


@mode("text_then_bomb")
async def _text_then_bomb(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    return await srv.respond(w, 200, text_then_bomb(), headers={"Content-Encoding": "gzip"})


async def test_a_bomb_after_real_text_never_inflates_past_the_cap() -> None:
    """Each piece is inflated only up to what the cap has left: a bomb behind 3.5 MiB of
    text must not add another cap's worth to memory before it is refused."""
    text_then_bomb()  # built before memory is counted
    async with FaultServer() as server, make_session() as client:
        tracemalloc.start()
        try:
            result = await scrape(client, Target(server.url("text_then_bomb")),
                                  timeout_s=DEADLINE_S, max_bytes=CAP)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert result.failure == "bad_payload" and "size cap" in (result.error or "")
    assert peak < 2 * CAP, f"peak {peak:,} bytes while reading"  # ~1.4 caps here


async def test_each_request_names_kvtop_and_asks_for_gzip_only() -> None:
    """gzip is the one encoding asked for (kvtop decodes bodies itself, under the cap)."""
    async with FaultServer() as server, make_session() as client:
        assert (await scrape(client, Target(server.url()), timeout_s=DEADLINE_S)).ok
    (request,) = server.requests
    assert request.headers["user-agent"] == f"kvtop/{__version__}"
    assert request.headers["accept-encoding"].lower() == "gzip"


@mode("cookie")
async def _cookie(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    return await srv.respond(w, 200, srv.bodies[0], headers={"Set-Cookie": "session=abc; Path=/"})


async def test_cookies_a_server_sets_are_never_sent_back() -> None:
    async with FaultServer() as server, make_session() as client:
        url = server.url("cookie").replace("127.0.0.1", "localhost")  # IPs get no cookies anyway
        for _ in range(2):
            assert (await scrape(client, Target(url), timeout_s=DEADLINE_S)).ok
    assert [r.headers.get("cookie") for r in server.requests] == [None, None]


async def test_proxies_set_in_the_environment_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    async with FaultServer() as proxy, FaultServer() as server:
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.base_url)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        async with make_session() as client:
            result = await scrape(client, Target(server.url()), timeout_s=DEADLINE_S)
    assert result.ok and result.body == TEXT.decode()
    assert proxy.requests == [] and len(server.requests) == 1


async def test_a_hundred_hung_targets_do_not_hold_up_a_healthy_one() -> None:
    """No connection limit: each hung target holds its connection until its deadline, and
    the poller lets 128 requests run at once (aiohttp's default limit is 100)."""
    async with FaultServer(mode="hang") as hung, FaultServer() as healthy, \
            make_session() as client:
        stuck = [asyncio.create_task(scrape(client, Target(hung.url()), timeout_s=DEADLINE_S))
                 for _ in range(120)]
        try:
            await eventually(lambda: len(hung.requests) == 120, "120 hung requests")
            result = await scrape(client, Target(healthy.url()), timeout_s=DEADLINE_S / 4)
        finally:
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
    assert result.ok, result.error


async def test_scrapes_a_poll_apart_share_one_connection() -> None:
    """A new connection per scrape costs the server (and a TLS server a handshake) each time."""
    connections: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(TEXT) + TEXT)
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    target = Target(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics")
    try:
        async with make_session() as client:
            for _ in range(2):
                assert (await scrape(client, target, timeout_s=DEADLINE_S)).ok
                await asyncio.sleep(0.5)
    finally:
        for writer in connections:
            writer.close()
        server.close()
    assert len(connections) == 1


async def test_an_idle_connection_is_closed_by_kvtop_after_its_keep_alive(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kvtop hangs up an idle connection before the server does (uvicorn: after 5 s), so it
    never sends a request on a socket the server is closing."""
    assert http.KEEPALIVE_S < 5.0
    monkeypatch.setattr(http, "KEEPALIVE_S", 0.2)  # the same, without the wait
    hung_up = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
                     % len(TEXT) + TEXT)
        await writer.drain()
        if await reader.read() == b"":  # the client closed its end
            hung_up.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with make_session() as client:
            result = await scrape(client, Target(f"http://127.0.0.1:{port}/metrics"),
                                  timeout_s=DEADLINE_S)
            assert result.ok, result.error
            await asyncio.wait_for(hung_up.wait(), DEADLINE_S / 4)
    finally:
        server.close()


def test_a_failure_reads_as_its_reason() -> None:
    """Where a failure is quoted as text (Prometheus's instances), it reads as its reason."""
    assert str(Failed("down", "connection refused")) == "connection refused"


FAILING = "HTTP 500: the server is failing or not ready"


ANSWERS = {  # name -> (status, body, Content-Type) served by mode "answer"
    "llama.cpp loading": (503, b'{"error":{"code":503,"message":"Loading model"}}', "json"),
    "FastAPI detail": (500, b'{"detail":"Engine core died"}', "json"),
    "error string": (500, b'{"error":"engine crashed","code":500}', "json"),
    "nested error": (500, b'{"error":{"error":"out of memory"}}', "json"),
    "JSON without a message": (500, b'{"status":"dead"}', "json"),
    "nginx page": (502, b"<html><head><TITLE>502 Bad\n Gateway</TITLE></head>"
                        b"<body><h1>502</h1></body></html>", "text/html"),
    "long text": (500, b"stack trace:\n  " + b"x" * 300, "text/plain"),
    "terminal escapes": (500, b"\x1b[31mred alert\x1b[0m", "text/plain"),
    "empty": (500, b"", "text/plain"),
    "not UTF-8": (500, b"caf\xe9 closed", "text/plain"),
    "over 2 KB": (500, b"error " * 1000, "text/plain"),
    "teapot": (418, b"I'm a teapot", "text/plain"),
    "bad request": (400, b"Bad Request", "text/plain"),
    "multiple choices": (300, b"pick one", "text/plain"),
}


@mode("answer")
async def _answer(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    status, body, content_type = ANSWERS[req.query["as"]]
    return await srv.respond(w, status, body, content_type=content_type)


async def read_answer(name: str) -> Scrape:
    async with FaultServer() as server, make_session() as client:
        url = server.url("answer", urlencode({"as": name}))
        return await scrape(client, Target(url), timeout_s=DEADLINE_S)


@pytest.mark.parametrize(("name", "kind", "reason"), [
    ("llama.cpp loading", "down", "HTTP 503: the server is failing or not ready (Loading model)"),
    ("FastAPI detail", "down", f"{FAILING} (Engine core died)"),
    ("error string", "down", f"{FAILING} (engine crashed)"),
    ("nested error", "down", f"{FAILING} (out of memory)"),
    ("JSON without a message", "down", f'{FAILING} ({{"status":"dead"}})'),
    ("nginx page", "down", "HTTP 502: the server is failing or not ready (502 Bad Gateway)"),
    ("long text", "down", f"{FAILING} (stack trace: {'x' * 107})"),  # 120 characters
    ("terminal escapes", "down", FAILING),  # nothing unprintable is quoted
    ("empty", "down", FAILING),
    ("not UTF-8", "down", f"{FAILING} (caf\ufffd closed)"),
    ("over 2 KB", "down", FAILING),  # not worth quoting
    ("teapot", "bad_payload", "HTTP 418: not a metrics answer (I'm a teapot)"),
    ("bad request", "bad_payload", "HTTP 400: not a metrics answer (Bad Request)"),
    ("multiple choices", "bad_payload", "HTTP 300: a redirect kvtop could not follow (pick one)"),
])
async def test_an_error_answer_is_named_by_its_status_and_what_the_server_said(
        name: str, kind: str, reason: str) -> None:
    result = await read_answer(name)
    assert (result.failure, result.error) == (kind, reason)


@pytest.mark.parametrize("token", ["dGVzdA/s3cret+t0ken", "s3cr\\u0065t-t0ken"])
async def test_a_token_echoed_in_a_json_error_is_masked_however_it_was_escaped(
        token: str) -> None:
    """Some encoders write '/' as '\\/' (the raw text then lacks the token, the message has
    it); a server pasting the header into its JSON unescaped leaves a '\\u' the parser
    would turn into something else (the raw text has the token, the message does not).
    Here the token straddles the 120th character, where the quote is cut."""
    said = f"{'x' * 110} {token}".replace("/", "\\/")
    body = b'{"detail": "' + said.encode() + b'"}'
    async with FaultServer() as server, make_session() as client:
        ANSWERS["echo"] = (500, body, "json")
        try:
            result = await scrape(client, Target(server.url("answer", "as=echo"),
                                                 token=Secret(token)), timeout_s=DEADLINE_S)
        finally:
            del ANSWERS["echo"]
    assert result.failure == "down"
    assert result.error == f"{FAILING} ({'x' * 110} {MASK})"


def test_targets_are_added_before_polling_once_each_and_removed_quietly() -> None:
    first, second = Target("http://127.0.0.1:9/metrics"), Target("http://127.0.0.1:10/metrics")
    poller = Poller([first])  # built outside any event loop, as a program does
    poller.add_target(second)
    poller.add_target(first)  # known already
    assert poller.targets == (first, second)
    assert poller.state(second).failures == 0 and poller.state(second).version is None
    poller.remove_target(Target("http://127.0.0.1:11/metrics"))  # never added
    poller.remove_target(first)  # not running: nothing in flight to cancel
    assert poller.targets == (second,)


async def test_a_target_removed_while_its_attempt_hangs_is_never_reported_again() -> None:
    async with FaultServer(mode="hang") as hung, FaultServer() as healthy:
        gone, kept = Target(hung.url()), Target(healthy.url())
        after_removal: list[Scrape] = []
        removed_at: list[float] = []
        stop = asyncio.Event()
        async with Poller([gone, kept], interval_s=0.05, timeout_s=1.0) as poller:

            def on_scrape(result: Scrape) -> None:
                if removed_at:
                    after_removal.append(result)
                    if result.t > removed_at[0] + 1.5:  # past the hung attempt's deadline
                        stop.set()
                elif hung.requests:  # its attempt is in flight
                    poller.remove_target(gone)
                    removed_at.append(time.time())

            await asyncio.wait_for(poller.run(on_scrape, stop=stop), DEADLINE_S)
    assert after_removal and {s.target for s in after_removal} == {kept}


async def test_a_poller_runs_once_at_a_time(fault_server: FaultServer) -> None:
    stop, stopped = asyncio.Event(), asyncio.Event()
    stopped.set()
    async with Poller([Target(fault_server.url())], interval_s=0.05) as poller:
        running = asyncio.create_task(poller.run(lambda s: None, stop=stop))
        await eventually(lambda: fault_server.hits, "a first scrape")
        with pytest.raises(RuntimeError, match=r"^Poller\.run is already running$"):
            await poller.run(lambda s: None, stop=stopped)
        stop.set()
        await asyncio.wait_for(running, DEADLINE_S)


def padded(size: int) -> bytes:
    """The fixture padded with comment lines to exactly ``size`` bytes."""
    body = fixture()
    while len(body) < size:
        body += b"#" + b" " * min(98, size - len(body) - 2) + b"\n"
    assert len(body) == size
    return body


@pytest.mark.parametrize(("size", "in_a_thread"), [
    (len(fixture()), False), (OFF_LOOP_CHARS, False), (OFF_LOOP_CHARS + 100, True)])
async def test_a_body_is_read_with_the_servers_version_in_the_loop_or_over_the_limit_in_a_thread(
        size: int, in_a_thread: bool) -> None:
    """Up to OFF_LOOP_CHARS a body is read in the event loop (nothing to pace: read_s 0),
    over it in a worker thread; either way with /version's answer (it decides how an old
    vLLM's pool is counted)."""
    async with FaultServer(bodies=[padded(size)], version="0.33.0") as server, \
            Poller([Target(server.url())], timeout_s=DEADLINE_S) as poller:
        (result,) = await poller.poll_once()
        read_s = poller.state(result.target).read_s
    assert result.ok and result.reading is not None, result.error
    assert result.reading.version == "0.33.0"
    assert (read_s > 0) == in_a_thread


def test_a_healthy_target_waits_the_interval_and_a_first_failure_its_jitter() -> None:
    for jitter in (0.8, 1.0, 3.0):  # healthy: the interval, whatever the jitter
        assert backoff_delay(0, 1.0, 30.0, jitter=jitter) == 1.0
    assert backoff_delay(1, 1.0, 30.0, jitter=1.2) == pytest.approx(1.2)


def test_a_narrowed_url_is_the_url_asked_for_and_nothing_else() -> None:
    assert narrowed_url("http://gpu-1:8000/metrics", ["vllm:b", "vllm:a"]) == (
        "http://gpu-1:8000/metrics/?name%5B%5D=vllm%3Aa&name%5B%5D=vllm%3Ab")


async def test_a_bug_while_polling_one_target_is_logged_and_polling_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        fault_server: FaultServer) -> None:
    real, calls = poller_module.interpret, []

    async def broken_once(result: Scrape) -> float:  # a bug in reading, the first time only
        calls.append(result)
        if len(calls) == 1:
            raise RuntimeError("adapter bug")
        return await real(result)

    monkeypatch.setattr(poller_module, "interpret", broken_once)
    target, seen, stop = Target(fault_server.url()), [], asyncio.Event()

    def on_scrape(result: Scrape) -> None:
        seen.append(result)
        stop.set()

    with caplog.at_level(logging.ERROR, logger=poller_module.__name__):
        async with Poller([target], interval_s=0.05) as poller:
            await asyncio.wait_for(poller.run(on_scrape, stop=stop), DEADLINE_S)
    assert len(calls) >= 2 and seen[0].ok  # the next attempt was read and delivered
    (record,) = [r for r in caplog.records if r.exc_info]
    assert record.getMessage() == f"polling {target.label} failed"
    assert str(record.exc_info[1]) == "adapter bug"


async def test_a_poller_runs_again_after_it_stopped_and_leaves_nothing_running(
        fault_server: FaultServer) -> None:
    def polling_tasks() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() if "Poller" in t.get_coro().__qualname__]

    async with Poller([Target(fault_server.url())], interval_s=0.05) as poller:
        for _ in range(2):
            stop, seen = asyncio.Event(), []

            def on_scrape(result: Scrape, seen: list[Scrape] = seen,
                          stop: asyncio.Event = stop) -> None:
                seen.append(result)
                stop.set()

            await http.within(DEADLINE_S, poller.run(on_scrape, stop=stop))  # no task between
            assert seen and seen[0].ok
            assert polling_tasks() == []  # every target's task ended with run()


async def let_the_loop_run() -> None:
    """A few turns of the event loop: enough for any woken waiter to run (no time passes)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_the_gate_lets_its_size_in_and_the_others_in_their_turn() -> None:
    gate, inside, leave = Gate(2), [], {n: asyncio.Event() for n in range(6)}

    async def request(n: int) -> None:
        async with gate:
            inside.append(n)
            await leave[n].wait()

    tasks = [asyncio.create_task(request(n)) for n in range(5)]
    await let_the_loop_run()
    assert inside == [0, 1]
    leave[1].set()
    await let_the_loop_run()
    assert inside == [0, 1, 2]  # one left, the first waiting came in
    tasks[3].cancel()  # gave up waiting: skipped when its turn comes
    leave[0].set()
    await let_the_loop_run()
    assert inside == [0, 1, 2, 4]
    tasks.append(asyncio.create_task(request(5)))
    await let_the_loop_run()
    assert inside == [0, 1, 2, 4]  # 2 and 4 hold both places
    leave[2].set()
    await let_the_loop_run()
    assert inside == [0, 1, 2, 4, 5]
    for n in (4, 5):
        leave[n].set()
    await asyncio.gather(*tasks, return_exceptions=True)

    async def both_places() -> None:
        async with gate, gate:
            pass

    await asyncio.wait_for(both_places(), DEADLINE_S)  # both places are free again


async def test_a_turn_that_comes_as_its_waiter_leaves_is_passed_on() -> None:
    gate = Gate(1)
    await gate.__aenter__()
    inside: list[str] = []

    async def request(name: str) -> None:
        async with gate:
            inside.append(name)

    leaving, next_one = (asyncio.create_task(request(n)) for n in ("leaving", "next"))
    await let_the_loop_run()
    await gate.__aexit__(None, None, None)  # the turn goes to "leaving"...
    leaving.cancel()  # ...which is cancelled before it can run
    await asyncio.wait_for(next_one, DEADLINE_S)
    assert inside == ["next"]
    assert leaving.cancelled()


async def test_failing_targets_back_off_with_jitter_not_in_lockstep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    interval, planned = 0.05, []  # (failures so far, delay) after each attempt
    real = poller_module.backoff_delay

    def spy(failures: int, interval_s: float, max_backoff_s: float, jitter: float = 1.0) -> float:
        delay = real(failures, interval_s, max_backoff_s, jitter)
        planned.append((failures, delay))
        return delay

    monkeypatch.setattr(poller_module, "backoff_delay", spy)
    attempts, stop = [], asyncio.Event()

    def on_scrape(result: Scrape) -> None:
        attempts.append(result)
        if len(attempts) == 9:
            stop.set()

    async with FaultServer(mode="error500") as server:
        targets = [Target(server.url(query=f"n={n}")) for n in range(3)]
        async with Poller(targets, interval_s=interval, max_backoff_s=10.0, seed=1) as poller:
            await asyncio.wait_for(poller.run(on_scrape, stop=stop), DEADLINE_S)
    doubled = [delay for failures, delay in planned if failures == 2]
    assert len(doubled) >= 2
    assert all(0.8 * 2 * interval <= delay <= 1.2 * 2 * interval for delay in doubled)
    assert len(set(doubled)) == len(doubled)  # each its own: they do not retry together


async def test_a_consumer_that_fails_is_logged_with_the_target_and_polling_goes_on(
        caplog: pytest.LogCaptureFixture, fault_server: FaultServer) -> None:
    target, seen, stop = Target(fault_server.url()), [], asyncio.Event()

    def on_scrape(result: Scrape) -> None:
        seen.append(result)
        if len(seen) == 2:
            stop.set()
        raise RuntimeError("consumer bug")

    with caplog.at_level(logging.ERROR, logger=poller_module.__name__):
        async with Poller([target], interval_s=0.05) as poller:
            await asyncio.wait_for(poller.run(on_scrape, stop=stop), DEADLINE_S)
    records = [r for r in caplog.records if r.exc_info]
    assert len(records) == 2
    assert {r.getMessage() for r in records} == {f"on_scrape failed for {target.label}"}
    assert all(str(r.exc_info[1]) == "consumer bug" for r in records)


async def test_a_body_the_adapters_refuse_is_a_bad_payload_with_their_reason() -> None:
    body = bodies.bad_config("num_gpu_blocks", "inf").encode()
    async with FaultServer(bodies=[body]) as server, \
            Poller([Target(server.url())], timeout_s=DEADLINE_S) as poller:
        (result,) = await poller.poll_once()
    assert result.failure == "bad_payload" and not result.ok
    assert "num_gpu_blocks='inf'" in (result.error or "")
    assert "not a usable count" in (result.error or "")
    assert result.reading is None


@pytest.mark.parametrize(("timeout_s", "at_least", "under"), [
    (0.3, 0.0, 1.5),  # not past the poller's timeout
    (DEADLINE_S, 2.0, 4.0),  # nor past 2 s (the scrape itself takes milliseconds)
])
async def test_a_server_whose_version_hangs_is_read_waiting_2_s_or_the_timeout_if_shorter(
        timeout_s: float, at_least: float, under: float) -> None:
    async with FaultServer(version_mode="hang") as server, \
            Poller([Target(server.url())], timeout_s=timeout_s) as poller:
        started = time.perf_counter()
        (result,) = await asyncio.wait_for(poller.poll_once(), DEADLINE_S / 4)
        took = time.perf_counter() - started
    assert result.ok and result.version is None
    assert at_least <= took < under, f"{took:.2f} s"


BOM = b"\xef\xbb\xbf"


SAMPLE = b'a{x="1"} 1\n'  # a one-letter name: the text starts at its very first byte
ANSWERS.update({  # the 200 answers of mode "answer"
    "blank": (200, b" \r\n\t\n", "text/plain"),
    "HTML after 63 blank lines": (200, b"\n" * 63 + b"<html>", "text/plain"),
    "HTML after 64 blank lines": (200, b"\n" * 64 + b"<html>", "text/plain"),
    "JSON": (200, b' \n {"status": "ok", "detail": "all is well in here"}\n', "json"),
})


@pytest.mark.parametrize(("name", "reason"), [
    ("blank", "empty body: the server answered with no metrics"),
    ("HTML after 63 blank lines", HTML_PAGE),
    # the first tag is looked for in the first 64 bytes only (a body may be 16 MiB)
    ("HTML after 64 blank lines", "not Prometheus text: it starts with '<html>'"),
    ("JSON", """not Prometheus text: it starts with '{"status": "ok", "detail": "all is well '"""),
])
async def test_a_body_that_is_not_metrics_text_is_refused_saying_what_it_is(
        name: str, reason: str) -> None:
    result = await read_answer(name)
    assert (result.failure, result.error, result.body) == ("bad_payload", reason, None)


@pytest.mark.parametrize(("body", "text"), [
    (BOM + fixture(), fixture().decode()), (BOM + SAMPLE, SAMPLE.decode()),
    (SAMPLE, SAMPLE.decode())],
    ids=["BOM, then a vLLM scrape", "BOM, then one sample", "one sample"])
async def test_metrics_text_is_read_from_its_first_byte_after_any_byte_order_mark(
        body: bytes, text: str) -> None:
    async with FaultServer(bodies=[body]) as server, make_session() as client:
        result = await scrape(client, Target(server.url()), timeout_s=DEADLINE_S)
    assert result.ok and result.body == text, result.error


@mode("no_content_type")
async def _no_content_type(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(srv.bodies[0])}\r\n\r\n".encode()
    await srv.send(w, head + srv.bodies[0])
    return True


@mode("echo_in_label")
async def _echo_in_label(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    """Metrics with the Authorization header pasted into a label, as a careless proxy might."""
    said = req.headers.get("authorization", "")
    return await srv.respond(w, 200, srv.bodies[0] + f'probe{{auth="{said}"}} 1\n'.encode())


async def test_a_body_is_read_without_a_content_type_and_with_an_echoed_token_masked() -> None:
    token = "s3cret-t0ken"
    async with FaultServer() as server, make_session() as client:
        bare = await scrape(client, Target(server.url("no_content_type")), timeout_s=DEADLINE_S)
        echoed = await scrape(client, Target(server.url("echo_in_label"), token=Secret(token)),
                              timeout_s=DEADLINE_S)
    assert bare.ok and bare.body == fixture().decode(), bare.error
    assert echoed.ok and echoed.body is not None
    assert token not in echoed.body and echoed.body.endswith(f'probe{{auth="Bearer {MASK}"}} 1\n')


async def test_a_body_announced_at_exactly_the_cap_is_read_and_one_byte_over_is_not() -> None:
    size = len(fixture())
    async with FaultServer() as server, make_session() as client:
        at_cap = await scrape(client, Target(server.url()), timeout_s=DEADLINE_S, max_bytes=size)
        over = await scrape(client, Target(server.url()), timeout_s=DEADLINE_S,
                            max_bytes=size - 1)
    assert at_cap.ok, at_cap.error
    assert (over.failure, over.error) == ("bad_payload", (
        f"Content-Length {size:,} is over the {size - 1:,}-byte size cap; dropped "
        "(a guard against broken or hostile servers)"))


async def test_a_body_cut_short_says_so() -> None:
    async with FaultServer(mode="truncated") as server, make_session() as client:
        result = await scrape(client, Target(server.url()), timeout_s=DEADLINE_S)
    assert (result.failure, result.error) == (
        "bad_payload", "response cut short: the connection closed mid-body")


@mode("after_hops")
async def _after_hops(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    """The answer after as many redirects as the path's first part says (/2/metrics: 2)."""
    left = int(req.query.get("left", req.path.split("/")[1]))
    if left:
        return await srv.respond(w, 307, headers={"Location": f"{req.path}?left={left - 1}"})
    if req.path.endswith("/version"):
        return await srv.respond(w, 200, b'{"version": "0.33.0"}', content_type="application/json")
    return await srv.respond(w, 200, srv.bodies[0])


@pytest.mark.parametrize(("hops", "followed"), [(1, True), (2, True), (3, False)])
async def test_metrics_and_version_are_followed_through_two_redirects_and_no_more(
        hops: int, followed: bool) -> None:
    async with FaultServer(mode="after_hops", version_mode="after_hops") as server, \
            make_session() as client:
        target = Target(f"{server.base_url}/{hops}/metrics")
        result = await scrape(client, target, timeout_s=DEADLINE_S)
        version = await read_version(client, target, timeout_s=DEADLINE_S)
    if followed:
        assert result.ok and version == "0.33.0", result.error
    else:
        assert (result.failure, result.error) == (
            "bad_payload", "redirect loop: too many redirects")
        assert version is None


@mode("elsewhere")
async def _elsewhere(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    return await srv.respond(w, 307, headers={"Location": req.query["to"]})


async def test_a_redirect_keeps_the_token_on_its_server_and_never_takes_it_elsewhere() -> None:
    async with FaultServer(mode="after_hops") as here, FaultServer() as elsewhere, \
            make_session() as client:
        results = [await scrape(client, Target(url, token=Secret("s3cret")), timeout_s=DEADLINE_S)
                   for url in (f"{here.base_url}/1/metrics",
                               here.url("elsewhere", urlencode({"to": elsewhere.url()})))]
    assert all(result.ok for result in results)
    assert [r.headers.get("authorization") for r in here.requests] == ["Bearer s3cret"] * 3
    assert [r.headers.get("authorization") for r in elsewhere.requests] == [None]


@mode("version_behind_auth")
async def _version_behind_auth(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    if req.headers.get("authorization") != f"Bearer {srv.token}":
        return await srv.respond(w, 401, b'{"version": "from a 401"}',
                                 content_type="application/json")
    return await srv.respond(w, 200, b'{"version": "0.33.0"}', content_type="application/json")


async def test_version_is_asked_with_the_token_and_only_a_200_answer_counts() -> None:
    """Behind a proxy that guards every path, /version wants the token too."""
    async with FaultServer(mode="auth", token="s3cret",
                           version_mode="version_behind_auth") as server, make_session() as client:
        with_token = await read_version(client, Target(server.url(), token=Secret("s3cret")))
        refused = await read_version(client, Target(server.url()))
    assert (with_token, refused) == ("0.33.0", None)


@pytest.mark.parametrize(("said", "version"), [
    (" 0.33.0 ", "0.33.0"),
    ("   ", None),
    ("0.33\x1b[2J", None),  # a terminal escape is never shown
    ("v" * 100, "v" * 64),
    ("0.33.0+s3cret", f"0.33.0+{MASK}"),  # a token in it is masked before the cut
], ids=["padded", "blank", "escape", "long", "token"])
async def test_a_version_is_shown_trimmed_cut_and_masked_or_not_at_all(
        said: str, version: str | None) -> None:
    async with FaultServer(version_body=json.dumps({"version": said}).encode()) as server, \
            make_session() as client:
        assert await read_version(client, Target(server.url(), token=Secret("s3cret"))) == version


def test_version_sits_beside_metrics_or_at_the_servers_root() -> None:
    assert version_url(Target("http://h:8000/proxy/vllm/metrics")) == "http://h:8000/proxy/vllm/version"
    assert version_url(Target("http://h:8000/stats/prometheus")) == "http://h:8000/version"


@mode("status_line_echo")
async def _status_line_echo(srv, req, w) -> bool:  # type: ignore[no-untyped-def]
    """A broken status line quoting the token (no "Bearer" before it to give it away): the
    client's error quotes it."""
    token = req.headers.get("authorization", "").removeprefix("Bearer ")
    await srv.send(w, f"HTTP/1.1 abc {token}\r\n\r\n".encode())
    return False


async def test_a_failed_request_says_whether_it_connected_and_never_quotes_the_token(
        caplog: pytest.LogCaptureFixture) -> None:
    async with FaultServer() as server, make_session() as client:
        echoed = Target(server.url("status_line_echo"), token=Secret("s3cret-t0ken"))
        refused = Target(f"http://127.0.0.1:{closed_port()}/metrics")
        with caplog.at_level(logging.DEBUG, logger=http.__name__):
            results = [await scrape(client, t, timeout_s=DEADLINE_S)
                       for t in (Target(server.url("reset")), echoed, refused)]
    assert [(r.failure, r.connected) for r in results] == [
        ("down", True), ("down", True), ("down", False)]
    assert f"abc {MASK}" in (results[1].error or "") and "s3cret" not in (results[1].error or "")
    # each failure is logged for whoever embeds the poller, with its traceback
    logged = [(r.getMessage(), r.levelno, bool(r.exc_info and r.exc_info[1]))
              for r in caplog.records]
    assert logged == [(f"scrape of {r.target.label} failed", logging.DEBUG, True) for r in results]


async def test_a_pollers_timeout_and_cap_hold_for_every_request() -> None:
    async with FaultServer(mode="slow", delay_s=2.0, version_mode="hang") as slow, \
            FaultServer() as healthy:
        async with Poller([Target(slow.url())], timeout_s=0.3) as poller:
            (timed_out,) = await poller.poll_once()
        async with Poller([Target(healthy.url())], timeout_s=DEADLINE_S,
                          max_bytes=1000) as poller:
            (capped,) = await poller.poll_once()
    assert (timed_out.failure, timed_out.error) == ("timeout", "no complete answer within 0.3 s")
    assert capped.failure == "bad_payload" and "1,000-byte size cap" in (capped.error or "")


async def test_tls_is_verified_by_a_poller_unless_it_is_told_not_to(
        self_signed: ssl.SSLContext) -> None:
    async with FaultServer(ssl_context=self_signed) as server:
        target = Target(server.url())
        async with Poller([target], timeout_s=DEADLINE_S) as strict:
            (refused,) = await strict.poll_once()
        async with Poller([target], timeout_s=DEADLINE_S, insecure=True) as lax:
            (accepted,) = await lax.poll_once()
    assert refused.failure == "down" and "--insecure" in (refused.error or "")
    assert accepted.ok, accepted.error


async def test_a_poller_closes_the_session_it_made_and_never_one_it_was_given(
        fault_server: FaultServer) -> None:
    target = Target(fault_server.url())
    async with make_session() as given:
        async with Poller([target], session=given, timeout_s=DEADLINE_S) as poller:
            (through_given,) = await poller.poll_once()
            assert poller.session is given
        assert through_given.ok and not given.closed
    poller = Poller([target], timeout_s=DEADLINE_S)
    await poller.poll_once()
    made = poller.session
    await poller.aclose()
    assert made.closed
    (again,) = await poller.poll_once()  # used after closing: it opens a new session
    assert again.ok and poller.session is not made
    await poller.aclose()


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan])
def test_an_interval_that_is_not_positive_is_refused_saying_so(value: float) -> None:
    with pytest.raises(ValueError, match=rf"^interval must be > 0 s, got {value}$"):
        Poller([], interval_s=value)
    poller = Poller([])
    with pytest.raises(ValueError, match=rf"^interval must be > 0 s, got {value}$"):
        poller.interval_s = value


def test_with_no_cap_a_failing_target_stops_doubling_at_two_to_the_thirty_intervals() -> None:
    assert backoff_delay(10**6, 1.0, math.inf) == 2.0**30  # and never overflows


async def test_a_gate_freed_with_no_one_waiting_still_lets_in_only_its_size() -> None:
    gate = Gate(1)
    async with gate:
        pass
    async with gate:
        second = asyncio.ensure_future(gate.__aenter__())
        await let_the_loop_run()
        assert not second.done()
    await let_the_loop_run()
    assert second.done()
    await gate.__aexit__(None, None, None)


def promised(pattern: str) -> float:
    """A number docs/security.md states, read from its text (lines joined)."""
    text = " ".join((REPO / "docs" / "security.md").read_text(encoding="utf-8").split())
    match = re.search(pattern, text)
    assert match, f"docs/security.md no longer says {pattern!r}"
    return float(match.group(1))


async def test_no_more_requests_are_in_flight_than_docs_promise() -> None:
    limit = int(promised(r"at most (\d+) requests are in flight"))
    async with FaultServer(mode="hang") as hung:
        targets = [Target(hung.url(query=f"n={n}")) for n in range(limit + 2)]
        async with Poller(targets, timeout_s=1.0) as poller:
            polling = asyncio.create_task(poller.poll_once())
            await eventually(lambda: len(hung.requests) >= limit, f"{limit} hung requests")
            await asyncio.sleep(0.2)  # time for any request past the limit to arrive
            in_flight = len(hung.requests)
            results = await asyncio.wait_for(polling, DEADLINE_S)
    assert in_flight == limit
    assert len(hung.requests) == limit + 2  # the last two had their turn after the others
    assert {r.failure for r in results} == {"timeout"}


async def test_a_failing_target_backs_off_to_one_attempt_in_what_docs_promise() -> None:
    cap = promised(r"backs off \(to one attempt in (\d+) s\)")
    poller = Poller([])
    assert poller.max_backoff_s == cap
    assert backoff_delay(20, poller.interval_s, poller.max_backoff_s, jitter=1.2) == cap


def test_a_poller_made_with_no_settings_polls_each_second_with_a_two_second_timeout() -> None:
    poller = Poller([])
    assert (poller.interval_s, poller.timeout_s) == (1.0, 2.0)


@pytest.mark.parametrize(("asked", "interval"), [(0.001, 0.05), (0.05, 0.05), (0.07, 0.07)])
def test_an_interval_under_50_ms_is_raised_to_50_ms(asked: float, interval: float) -> None:
    poller = Poller([], interval_s=asked)
    assert poller.interval_s == interval
    poller.interval_s = asked
    assert poller.interval_s == interval


async def test_a_slow_read_is_repeated_after_ten_of_its_reads_and_no_later() -> None:
    """A body read in a worker thread paces its target: the next attempt starts ten reads'
    time after this one started (docs/security.md: big bodies take at most a tenth of a core)."""
    seen: list[tuple[float, float, float | None]] = []
    stop = asyncio.Event()
    async with FaultServer(bodies=[bodies.many_models(3_000).encode()]) as slow:
        target = Target(slow.url())
        async with Poller([target], interval_s=0.05, timeout_s=DEADLINE_S) as poller:
            loop = asyncio.get_running_loop()

            def on_scrape(result: Scrape) -> None:
                state = poller.state(target)
                seen.append((loop.time(), state.read_s, state.next_due))
                if len(seen) == 2:
                    stop.set()

            await asyncio.wait_for(poller.run(on_scrape, stop=stop), DEADLINE_S)
    (delivered, read_s, _), (_, _, planned) = seen
    assert 10 * read_s > 0.05  # paced by its read, not by the interval
    assert planned is not None
    # planned = the first attempt's start + 10 reads; it was delivered one read or more later
    assert planned - delivered <= 9 * read_s


NARROW_TIMEOUT = 1.0


def test_narrowed_url_names_every_wanted_sample_after_a_trailing_slash() -> None:
    url = narrowed_url("http://gpu-1:8000/metrics", ["vllm:b_total", "vllm:a"])
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("http", "gpu-1:8000", "/metrics/")
    assert parts.query == "name%5B%5D=vllm%3Aa&name%5B%5D=vllm%3Ab_total"  # sorted, escaped
    assert parse_qs(parts.query) == {"name[]": ["vllm:a", "vllm:b_total"]}


def test_narrowed_url_keeps_the_path_prefix_and_the_query_given() -> None:
    url = narrowed_url("https://proxy/llm-a/metrics/?tenant=x", ["vllm:a"])
    parts = urlsplit(url)
    assert parts.path == "/llm-a/metrics/"
    assert parse_qs(parts.query) == {"tenant": ["x"], "name[]": ["vllm:a"]}


async def test_a_vllm_server_is_read_narrowed_with_the_same_numbers() -> None:
    async with SimFleet([SimConfig(autostep=False)]) as fleet:
        target = Target(fleet.urls[0] + "/metrics")
        async with Poller([target], narrow=True, timeout_s=NARROW_TIMEOUT) as narrowing:
            (narrowed,) = await narrowing.poll_once()
            assert narrowing.state(target).narrows is True
        async with Poller([target], timeout_s=NARROW_TIMEOUT) as plain:
            (full,) = await plain.poll_once()
        assert fleet.servers[0].scrapes == 2  # one request each: no retry was needed
    assert narrowed.ok and full.ok
    assert narrowed.body is not None and full.body is not None
    assert len(narrowed.body) < len(full.body) / 3
    names = {line.split("{")[0].split(" ")[0] for line in narrowed.body.splitlines()
             if not line.startswith("#")}
    assert names <= WANTED
    assert read_exposition(narrowed.body).engines == read_exposition(full.body).engines


@pytest.mark.parametrize("names", ["v0", "sglang"])
async def test_a_multiprocess_server_answers_nothing_and_is_read_whole(names: str) -> None:
    async with SimFleet([SimConfig(names=names, autostep=False)]) as fleet:  # type: ignore[arg-type]
        server = fleet.servers[0]
        target = Target(fleet.urls[0] + "/metrics")
        async with Poller([target], narrow=True, timeout_s=NARROW_TIMEOUT) as poller:
            first = await poller.poll_once()
            assert server.scrapes == 2  # the empty narrowed answer, then the retry
            second = await poller.poll_once()
            assert server.scrapes == 3  # from then on, only the URL given
            assert poller.state(target).narrows is False
    for (answer,) in (first, second):
        assert answer.ok, answer.error
        assert read_exposition(answer.body or "").kind == ("sglang" if names == "sglang"
                                                           else "vllm")


# No route there, a server error there, a proxy that only lets /metrics through.
@pytest.mark.parametrize("slash_mode", ["notfound", "error500", "forbidden"])
async def test_a_server_without_the_route_is_read_at_its_url(slash_mode: str) -> None:
    async with FaultServer(slash_mode=slash_mode) as server:
        target = Target(server.url())
        async with Poller([target], narrow=True, timeout_s=NARROW_TIMEOUT) as poller:
            (first,) = await poller.poll_once()
            (second,) = await poller.poll_once()
            assert poller.state(target).narrows is False
    assert first.ok and second.ok
    paths = [r.path for r in server.requests if not r.path.endswith("/version")]
    assert paths == ["/metrics/", "/metrics", "/metrics"]


async def test_once_the_server_is_known_only_its_adapters_names_are_asked_for(
    fault_server: FaultServer,
) -> None:
    async with Poller([Target(fault_server.url())], narrow=True,
                      timeout_s=NARROW_TIMEOUT) as poller:
        for _ in range(3):
            await poller.poll_once()
    asked = [set(parse_qs(urlsplit(r.target).query)["name[]"])
             for r in fault_server.requests if r.path == "/metrics/"]
    assert asked == [set(WANTED), set(vllm.NAMES), set(vllm.NAMES)]
    assert len(vllm.NAMES) < len(WANTED)


async def test_a_server_that_ignores_the_names_is_read_whole_without_a_retry(
    fault_server: FaultServer,
) -> None:
    target = Target(fault_server.url())
    async with Poller([target], narrow=True, timeout_s=NARROW_TIMEOUT) as poller:
        (result,) = await poller.poll_once()
        assert poller.state(target).narrows is True
    assert result.ok and read_exposition(result.body or "").kind == "vllm"
    assert [r.path for r in fault_server.requests if r.path.endswith("/")] == ["/metrics/"]
    assert fault_server.hits == 1


async def test_a_narrowed_timeout_is_reported_without_asking_again() -> None:
    async with FaultServer(slash_mode="hang") as server:
        target = Target(server.url())
        async with Poller([target], narrow=True, timeout_s=0.3) as poller:
            (result,) = await poller.poll_once()
            assert poller.state(target).narrows is None
    assert result.failure == "timeout"
    assert server.hits == 0  # a slow server is not asked twice in one attempt


async def test_a_server_that_stops_filtering_is_read_whole_again() -> None:
    async with FaultServer() as server:
        target = Target(server.url())
        async with Poller([target], narrow=True, timeout_s=NARROW_TIMEOUT) as poller:
            await poller.poll_once()
            assert poller.state(target).narrows is True
            server.slash_mode = "empty"  # e.g. restarted with several API servers
            (result,) = await poller.poll_once()
            assert result.ok, result.error
            assert poller.state(target).narrows is False


async def test_a_failure_makes_the_next_attempt_ask_again() -> None:
    async with FaultServer(slash_mode="notfound") as server:
        target = Target(server.url())
        async with Poller([target], narrow=True, timeout_s=NARROW_TIMEOUT) as poller:
            await poller.poll_once()
            assert poller.state(target).narrows is False
            server.mode = "error500"
            (failed,) = await poller.poll_once()
            assert failed.failure == "down" and "HTTP 500" in (failed.error or "")
            assert poller.state(target).narrows is None  # the server may have changed
            server.mode, server.slash_mode = "ok", None
            (result,) = await poller.poll_once()
            assert result.ok and poller.state(target).narrows is True


async def test_without_narrow_only_the_url_given_is_read(fault_server: FaultServer) -> None:
    async with Poller([Target(fault_server.url())], timeout_s=NARROW_TIMEOUT) as poller:
        await poller.poll_once()
    assert not any(r.path.endswith("/") for r in fault_server.requests)
