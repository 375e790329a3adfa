"""What a scrape says about an answer that is not metrics text, from a real server on
127.0.0.1: an HTML page (by its content type, whatever it starts with) and binary data
(NUL bytes, as protobuf and compressed files have) are named as what they are."""

from __future__ import annotations

import asyncio
import functools
import gzip
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
from urllib.parse import urlencode

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from kvtop import __version__
from kvtop.collect import http
from kvtop.collect import poller as poller_module
from kvtop.collect.http import Failed, classify_exception, make_session
from kvtop.collect.poller import (
    OFF_LOOP_CHARS,
    Gate,
    Poller,
    backoff_delay,
    narrowed_url,
    read_version,
    scrape,
    version_url,
)
from kvtop.collect.target import MASK, Scrape, Secret, Target
from tests.faultserver import FaultServer, closed_port, fixture, mode
from tests.hostile import bodies
from tests.paths import REPO
from tests.waiting import DEADLINE_S, eventually

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


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with make_session() as session:
        yield session


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


# -- every failure as a kind and a reason a person can act on -------------------------------


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


# -- compressed bodies: decoded here, under the cap, and named when they are not what they say --

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
                                  "identity", "Identity"])
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
    ("a hostile encoding", f"unsupported Content-Encoding {'x' * 40!r}"),
])
async def test_a_body_that_cannot_be_decoded_says_why(name: str, reason: str) -> None:
    result = await read_encoded(name)
    assert (result.failure, result.error) == ("bad_payload", reason)
    assert result.body is None


async def test_a_decoded_body_over_the_cap_is_dropped_with_the_cap_named() -> None:
    result = await read_encoded("gzip", max_bytes=len(TEXT) - 1)  # sent small, decoded over
    assert (result.failure, result.error) == (
        "bad_payload", f"the body is over the {len(TEXT) - 1:,}-byte size cap; dropped "
                       "(raise the cap if it is real)")


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


# -- what kvtop's requests carry, and what they ignore -------------------------------------------


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


# -- an answer that is not 2xx: its status, and a short quote of what the server said ---------

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


# -- targets added and removed, a big body's version, one run at a time -----------------------


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


# -- the gate: at most MAX_IN_FLIGHT requests at once, the others in turn ---------------------


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


# -- a 200 answer read as text: what is refused, word for word, and what is read whole ------

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
        "(raise the cap if it is real)"))


async def test_a_body_cut_short_says_so() -> None:
    async with FaultServer(mode="truncated") as server, make_session() as client:
        result = await scrape(client, Target(server.url()), timeout_s=DEADLINE_S)
    assert (result.failure, result.error) == (
        "bad_payload", "response cut short: the connection closed mid-body")


# -- redirects, /version, and what a failed request leaves behind ---------------------------


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
        with caplog.at_level(logging.DEBUG, logger=poller_module.__name__):
            results = [await scrape(client, t, timeout_s=DEADLINE_S)
                       for t in (Target(server.url("reset")), echoed, refused)]
    assert [(r.failure, r.connected) for r in results] == [
        ("down", True), ("down", True), ("down", False)]
    assert f"abc {MASK}" in (results[1].error or "") and "s3cret" not in (results[1].error or "")
    # each failure is logged for whoever embeds the poller, with its traceback
    logged = [(r.getMessage(), r.levelno, bool(r.exc_info and r.exc_info[1]))
              for r in caplog.records]
    assert logged == [(f"scrape of {r.target.label} failed", logging.DEBUG, True) for r in results]


# -- a poller's own settings and session ---------------------------------------------------


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


# -- the limits docs/security.md promises, and the defaults a program gets --------------------


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
