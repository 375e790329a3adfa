"""What a scrape says about an answer that is not metrics text, from a real server on
127.0.0.1: an HTML page (by its content type, whatever it starts with) and binary data
(NUL bytes, as protobuf and compressed files have) are named as what they are."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from kvtop.collect.http import make_session
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
