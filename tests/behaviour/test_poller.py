"""What a scrape says about an answer that is not metrics text, from a real server on
127.0.0.1: an HTML page (by its content type, whatever it starts with) and binary data
(NUL bytes, as protobuf and compressed files have) are named as what they are."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest

from kvtop.collect.http import classify_exception, make_session
from kvtop.collect.poller import scrape
from kvtop.collect.target import Scrape, Target
from tests.faultserver import FaultServer, mode

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


async def test_an_html_page_is_named_by_its_content_type(client: aiohttp.ClientSession) -> None:
    result = await read(client, "html_text_first")
    assert result.failure == "bad_payload" and not result.ok
    assert "HTML page" in (result.error or "")


async def test_an_html_page_is_named_by_its_first_tag(client: aiohttp.ClientSession) -> None:
    result = await read(client, "metrics_after_html")  # served as text/plain
    assert result.failure == "bad_payload" and "HTML page" in (result.error or "")


@pytest.mark.parametrize("name", ["protobuf", "nul_in_text"])
async def test_binary_data_is_named_as_binary(client: aiohttp.ClientSession, name: str) -> None:
    result = await read(client, name)
    assert result.failure == "bad_payload" and not result.ok
    assert "binary data" in (result.error or "")


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
