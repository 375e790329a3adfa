"""HTTP for kvtop's readers: one aiohttp session per event loop, bodies read under a size
cap, and every failure turned into a (kind, readable reason) pair.

aiohttp directly rather than httpx: with hundreds of targets a second, the client is most of
a monitor's CPU, and httpx's layers (even over its aiohttp transport) cost ~0.5 ms more per
50 KB scrape than aiohttp alone (docs/performance.md). Decompression is done here, not by
aiohttp, so the cap counts decoded bytes and a gzip bomb never inflates in memory.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import ssl
import sys
import zlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp
import certifi
from yarl import URL  # aiohttp's own URL type

from kvtop import __version__
from kvtop.collect.target import FailureKind

T = TypeVar("T")

# Keep-alive shorter than uvicorn's 5 s, so kvtop never reuses a socket the server is closing.
KEEPALIVE_S = 4.0
# aiohttp refuses the redirect that reaches this count: two are followed (some vLLM builds
# answered /metrics with 307 /metrics/)
MAX_REDIRECTS = 3
GZIP_MAGIC = b"\x1f\x8b"


class Failed(Exception):
    """A classified failure raised while reading one answer."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind
        self.message = message


# ---------------------------------------------------------------------------- the session


def make_session(*, insecure: bool = False) -> aiohttp.ClientSession:
    """The shared session (call it inside the event loop that uses it): TLS verified unless
    ``insecure``, no connection limit (a hung target holds its connection until its
    deadline, and must not starve the others), proxies and cookies ignored."""
    connector = aiohttp.TCPConnector(
        limit=0, ssl=False if insecure else verified_context(), keepalive_timeout=KEEPALIVE_S
    )
    return aiohttp.ClientSession(
        connector=connector,
        headers={"Accept-Encoding": "gzip", "User-Agent": f"kvtop/{__version__}"},
        auto_decompress=False,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None),  # callers set one total deadline
    )


@functools.lru_cache(maxsize=1)
def verified_context() -> ssl.SSLContext:
    """certifi's CAs, or SSL_CERT_FILE / SSL_CERT_DIR when set; built once (~0.1 s)."""
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile or None, capath=capath or None)
    return ssl.create_default_context(cafile=certifi.where())


@functools.lru_cache(maxsize=1 << 15)  # two URLs per target: a fleet of 10,000 fits
def parsed_url(text: str) -> URL:
    """A target's URL parsed once: aiohttp would parse the string on every request."""
    return URL(text)


def bearer(token: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Bearer {token}"} if token else None


# ---------------------------------------------------------------------------- bodies


async def read_capped(response: aiohttp.ClientResponse, max_bytes: int) -> bytearray:
    """The whole body, decoding gzip/deflate here so the cap counts decoded bytes."""
    encoding = response.headers.get("Content-Encoding", "")
    decoder = _decoder(encoding)
    buf = bytearray()
    async for chunk in response.content.iter_any():
        while decoder is not None and chunk:
            # max_length bounds the output of one chunk: a bomb never inflates past the cap.
            try:
                buf += decoder.decompress(chunk, max_bytes - len(buf) + 1)
            except zlib.error as exc:
                raise Failed("bad_payload", _undecodable(encoding, exc)) from None
            chunk = b""
            if decoder.eof and decoder.unused_data[:2] == GZIP_MAGIC:  # another member
                chunk, decoder = decoder.unused_data, _next_member(encoding)
            if len(buf) > max_bytes:
                break
        if decoder is None:
            buf += chunk
        if len(buf) > max_bytes:
            raise Failed("bad_payload", over_cap(max_bytes, "the body"))
    if decoder is not None and not decoder.eof:
        raise Failed("bad_payload", "response cut short: the compressed body ended early")
    return buf


def _next_member(encoding: str) -> Any:
    """The decoder of the next gzip member (RFC 1952: a body may hold several, and ``gzip
    -d`` reads them all; the second was once dropped without a word). Deflate has none."""
    if encoding.strip().lower() == "deflate":
        raise Failed("bad_payload", "corrupt deflate data (data after the end of the stream)")
    return zlib.decompressobj(16 + zlib.MAX_WBITS)


def _decoder(encoding: str) -> Any:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise Failed("bad_payload", f"unsupported Content-Encoding {encoding[:40]!r}")


def _undecodable(encoding: str, exc: zlib.error) -> str:
    """Why a compressed body can't be read, named for what it is."""
    encoding = encoding.strip().lower()
    if encoding == "deflate" and "header" in str(exc):
        return ("raw deflate data: 'Content-Encoding: deflate' must be zlib-wrapped "
                "(RFC 9110), and this body has no zlib header")
    if encoding != "deflate" and "header" in str(exc):
        return f"not gzip data, though the server says 'Content-Encoding: {encoding[:20]}'"
    return f"corrupt {'deflate' if encoding == 'deflate' else 'gzip'} data ({exc})"


def over_cap(max_bytes: int, what: str) -> str:
    return f"{what} is over the {max_bytes:,}-byte size cap; dropped (raise the cap if it is real)"


# ---------------------------------------------------------------------------- exceptions


def classify_exception(
    exc: BaseException, timeout_s: float | None = None
) -> tuple[FailureKind, str]:
    """(kind, readable reason) for an exception from one request; the whole cause chain
    counts (aiohttp wraps the OSError that says what happened)."""
    try:
        return _classify(_causes(exc), timeout_s)
    except Exception:  # exception classes with odd attributes must not escape
        return "down", f"cannot read the server: {type(exc).__name__}"


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 8:
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return chain


def _classify(chain: list[BaseException], timeout_s: float | None) -> tuple[FailureKind, str]:
    for e in chain:
        if isinstance(e, aiohttp.TooManyRedirects):
            return "bad_payload", "redirect loop: too many redirects"
        if isinstance(e, ssl.SSLCertVerificationError):
            return "down", _untrusted(_text(e))
        if isinstance(e, ssl.SSLError):
            return "down", _handshake_failed(getattr(e, "reason", None) or _text(e))
        if isinstance(e, socket.gaierror):
            return "down", "DNS lookup failed: unknown host"
        if isinstance(e, ConnectionRefusedError):
            return "down", "connection refused: nothing listens on that port"
        if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
            within = f" within {timeout_s:g} s" if timeout_s else ""
            return "timeout", f"no complete answer{within}"
    return "down", _describe(chain)


def _describe(chain: list[BaseException]) -> str:
    """The most specific readable message in the chain."""
    for e in chain:
        if isinstance(e, aiohttp.ServerDisconnectedError):
            return "the server closed the connection without answering"
        if isinstance(e, ConnectionResetError):
            return "connection reset by the server"
        if isinstance(e, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
            return f"unsupported URL: {_text(e)}"
        if isinstance(e, aiohttp.ClientResponseError):
            return f"broken HTTP answer: {e.message or _text(e)}"
        if isinstance(e, aiohttp.ClientConnectorError):
            return f"cannot connect: {e.os_error.strerror or _text(e.os_error)}"
    return f"cannot read the server: {_text(chain[-1])}"


def _untrusted(text: str) -> str:
    detail = text.split("certificate verify failed:")[-1].split("(_ssl")[0].strip(" ')]")
    return (
        f"TLS certificate not trusted ({detail}); pass --insecure to skip verification "
        "or point SSL_CERT_FILE at your CA"
    )


def _handshake_failed(detail: str) -> str:
    return f"TLS handshake failed ({detail}); does the server speak https?"


def _text(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return text or type(exc).__name__


# ---------------------------------------------------------------------------- deadlines


if sys.version_info >= (3, 11):

    async def within(seconds: float, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` with a total deadline (raises TimeoutError)."""
        async with asyncio.timeout(seconds):
            return await coro

else:  # pragma: no cover - Python 3.10

    async def within(seconds: float, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wait_for(coro, seconds)
