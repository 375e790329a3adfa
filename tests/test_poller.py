"""The poller against a real local HTTP server that injects faults."""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
import tracemalloc
from collections.abc import AsyncIterator

import aiohttp
import pytest

from kvtop.collect import poller as poller_module
from kvtop.collect.http import make_session, verified_context
from kvtop.collect.poller import (
    HINT_401_NO_TOKEN,
    HINT_401_TOKEN,
    Poller,
    backoff_delay,
    read_version,
    scrape,
    version_url,
)
from kvtop.collect.target import Scrape, Secret, Target
from tests.faultserver import BIG_BYTES, FaultServer, closed_port, fixture, mode
from tests.waiting import DEADLINE_S

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


# ---------------------------------------------------------------------------- one scrape

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


# ---------------------------------------------------------------------------- size cap


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


# ---------------------------------------------------------------------------- token


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


# ---------------------------------------------------------------------------- /version


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


# ---------------------------------------------------------------------------- many targets


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


# ---------------------------------------------------------------------------- schedule


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


# ---------------------------------------------------------------------------- TLS


async def test_tls_is_verified_unless_insecure(self_signed: ssl.SSLContext) -> None:
    async with FaultServer(ssl_context=self_signed) as srv:
        url = srv.url().replace("http://", "https://")
        async with make_session() as strict:
            refused = await scrape(strict, Target(url), timeout_s=2.0)
        async with make_session(insecure=True) as lax:
            accepted = await scrape(lax, Target(url), timeout_s=2.0)
    assert refused.failure == "down" and "--insecure" in (refused.error or "")
    assert accepted.ok and accepted.body == FIXTURE_TEXT
