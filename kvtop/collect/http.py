"""HTTP for kvtop's readers: one aiohttp session per event loop, one scrape of a
``/metrics`` (:func:`scrape`, which never raises) and of ``/version``, bodies read under a
size cap, and every failure turned into a (kind, readable reason) pair, as follows
(``Scrape.failure``):

==============  ===========================================================================
``down``        connection refused, DNS failure, reset or closed before any answer, TLS
                failure, HTTP 5xx except 501 (the status and the server's message are in
                ``error``)
``timeout``     no complete answer within ``timeout_s`` (a total deadline: a server
                dribbling bytes times out as surely as one that never answers)
``auth``        HTTP 401 / 403, with a hint on where the token goes
``bad_payload`` an answer that is not a usable exposition: 404 or 501 (no metrics there),
                other 4xx, a redirect loop, a body over ``max_bytes`` (decoded size, so a
                gzip bomb is caught), a body cut short, empty, HTML, binary, not UTF-8, not
                starting like Prometheus text, or refused by the parser and adapters (over
                their limits, or a value no KV pool can have: ``ServerReading.refused``)
==============  ===========================================================================

The poller (kvtop/collect/poller.py) decides when to scrape; this module what one scrape
says.

aiohttp directly rather than httpx: with hundreds of targets a second, the client is most of
a monitor's CPU, and httpx's layers (even over its aiohttp transport) cost ~0.5 ms more per
50 KB scrape than aiohttp alone (docs/performance.md). Decompression is done here, not by
aiohttp, so the cap counts decoded bytes and a gzip bomb never inflates in memory.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import socket
import ssl
import sys
import time
import zlib
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import certifi
from yarl import URL  # aiohttp's own URL type

from kvtop import __version__
from kvtop.collect.target import FailureKind, Scrape, Target
from kvtop.safe_text import mask, mask_bytes

log = logging.getLogger(__name__)
T = TypeVar("T")

# Keep-alive shorter than uvicorn's 5 s, so kvtop never reuses a socket the server is closing.
KEEPALIVE_S = 4.0
# aiohttp refuses the redirect that reaches this count: two are followed (some vLLM builds
# answered /metrics with 307 /metrics/)
MAX_REDIRECTS = 3
GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
VERSION_TIMEOUT_S = 2.0
VERSION_MAX_BYTES = 64 * 1024
ERROR_SNIPPET_BYTES = 2048

HINT_401_NO_TOKEN = (
    "HTTP 401: the server wants a bearer token; set it with token_env/token_file in the "
    "config or --token-env/--token-file (llama.cpp's --api-key also guards /metrics)"
)
HINT_401_TOKEN = (
    "HTTP 401: the server refused the bearer token; check the value behind "
    "token_env/token_file or --token-env/--token-file (for llama.cpp, its --api-key)"
)
HINT_403 = (
    "HTTP 403: forbidden; the token lacks access to /metrics, or a proxy in front of "
    "the server blocks it"
)
HINT_404 = (
    "HTTP 404: no /metrics here; is this an inference server? (vLLM serves it by default; "
    "SGLang needs --enable-metrics, llama.cpp --metrics)"
)
HINT_501 = "HTTP 501: metrics are switched off (llama.cpp: start llama-server with --metrics)"

_TEXT_START = re.compile(rb"\s*[#A-Za-z_:]")
_HTML_TITLE = re.compile(r"<title>(.*?)</title>", re.IGNORECASE | re.DOTALL)


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


@functools.lru_cache(maxsize=1 << 15)  # a fleet of 10,000 must not evict its own
def request_headers(target: Target) -> dict[str, str] | None:
    """What every request to ``target`` carries besides the session's: its token and its
    own headers (``--header``, ``headers`` in the config), revealed only here."""
    headers = {name: value if isinstance(value, str) else value.reveal()
               for name, value in target.headers}
    return {**headers, **(bearer(_token(target)) or {})} or None


@functools.lru_cache(maxsize=64)
def ca_context(cafile: str) -> ssl.SSLContext:
    """A context that trusts only the CA bundle at ``cafile`` (a target's ``--cacert``)."""
    return ssl.create_default_context(cafile=cafile)


def tls_for(target: Target, verify: bool) -> ssl.SSLContext | bool:
    """The TLS a request to ``target`` uses: its CA bundle, or (True) the session's own:
    the system's CAs, or none at all with --insecure (``verify`` False)."""
    return ca_context(target.cacert) if verify and target.cacert else True


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
    """No option raises the cap: a real body is far smaller, so the reason says what it is."""
    return (f"{what} is over the {max_bytes:,}-byte size cap; dropped "
            "(a guard against broken or hostile servers)")


# ---------------------------------------------------------------------------- one scrape


async def scrape(
    session: aiohttp.ClientSession,
    target: Target,
    *,
    timeout_s: float,
    max_bytes: int = DEFAULT_MAX_BYTES,
    url: str | None = None,
    verify: bool = True,
) -> Scrape:
    """One GET of ``url`` (default ``target.url``); every outcome, good or bad, is a Scrape
    (never raises). ``verify`` False: the session was made ``insecure``, and a target's CA
    bundle is not used either."""
    started_wall, started = time.time(), time.perf_counter()
    result = Scrape(target=target, t=started_wall)
    try:
        result.body = await within(timeout_s, _fetch(session, target, url, max_bytes,
                                                          verify))
    except Failed as failed:
        result.failure, result.error = failed.kind, failed.message
    except Exception as exc:
        result.failure, result.error = classify_exception(exc, timeout_s)
        result.connected = not isinstance(exc, aiohttp.ClientConnectorError)
        log.debug("scrape of %s failed", target.label, exc_info=True)
    result.duration_s = time.perf_counter() - started
    if result.error:  # answers were masked before quoting; this catches the rest
        result.error = mask(result.error, target.secrets)
    return result


def _token(target: Target) -> str | None:
    return target.token.reveal() if target.token is not None else None


async def _fetch(
    session: aiohttp.ClientSession, target: Target, url: str | None, max_bytes: int,
    verify: bool = True,
) -> str:
    async with session.get(
        parsed_url(url or target.url), headers=request_headers(target),
        max_redirects=MAX_REDIRECTS, ssl=tls_for(target, verify),
    ) as response:
        if not 200 <= response.status < 300:
            raise await _status_failure(response, target)
        declared = response.content_length
        if declared is not None and declared > max_bytes:
            raise Failed("bad_payload", over_cap(max_bytes, f"Content-Length {declared:,}"))
        # A server or proxy may echo the Authorization header: masked before the body is
        # quoted, parsed, shown, recorded or written to a snapshot.
        data = mask_bytes(await _read_body(response, max_bytes), target.secrets)
    return _decode_text(data, response.headers.get("Content-Type", ""))


async def _read_body(response: aiohttp.ClientResponse, max_bytes: int) -> bytearray:
    """The body within the cap; a connection lost mid-body is a bad payload, not 'down'."""
    try:
        return await read_capped(response, max_bytes)
    except (Failed, asyncio.TimeoutError, TimeoutError):
        raise
    except Exception as exc:
        raise Failed("bad_payload", "response cut short: the connection closed mid-body") from exc


def _decode_text(data: bytearray, content_type: str) -> str:
    if not data or data.isspace():
        raise Failed("bad_payload", "empty body: the server answered with no metrics")
    if "html" in content_type.lower() or data[:64].lstrip()[:1] == b"<":
        raise Failed(
            "bad_payload", "an HTML page, not metrics (a login page, proxy or web UI at this URL?)"
        )
    if b"\x00" in data:
        raise Failed("bad_payload", "binary data, not Prometheus text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Failed("bad_payload", f"not UTF-8 text (bad byte at offset {exc.start:,})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not _TEXT_START.match(data, 3 if data.startswith(b"\xef\xbb\xbf") else 0):
        first = text.lstrip()[:40]
        raise Failed("bad_payload", f"not Prometheus text: it starts with {first!r}")
    return text


# ---------------------------------------------------------------------------- HTTP status


async def _status_failure(response: aiohttp.ClientResponse, target: Target) -> Failed:
    status = response.status
    if status == 401:
        return Failed("auth", HINT_401_TOKEN if target.token is not None else HINT_401_NO_TOKEN)
    if status == 403:
        return Failed("auth", HINT_403)
    if status == 404:
        return Failed("bad_payload", HINT_404)
    said = await _server_message(response, target)
    if status == 501:
        return Failed("bad_payload", f"{HINT_501}{said}")
    if status >= 500:
        return Failed("down", f"HTTP {status}: the server is failing or not ready{said}")
    if 300 <= status < 400:
        return Failed("bad_payload", f"HTTP {status}: a redirect kvtop could not follow{said}")
    return Failed("bad_payload", f"HTTP {status}: not a metrics answer{said}")


async def _server_message(response: aiohttp.ClientResponse, target: Target) -> str:
    """A short quote of an error body (JSON message, HTML title or first text), or ''.
    Masked first, cut after: a token that straddled the cut would leak its first part."""
    try:
        raw = await read_capped(response, ERROR_SNIPPET_BYTES)
    except Exception:  # too long or broken: the status alone will do
        return ""
    text = mask(raw.decode("utf-8", errors="replace").strip(), target.secrets)
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):  # {"error": {"message": why}}, {"detail": why}, {"error": why}
        error = parsed.get("error")
        inner = error if isinstance(error, dict) else parsed
        for key in ("message", "detail", "error"):
            value = inner.get(key)
            if isinstance(value, str):
                text = value
                break
    elif match := _HTML_TITLE.search(text):
        text = match.group(1)
    text = mask(" ".join(text.split()), target.secrets)[:120]
    return f" ({text})" if text and text.isprintable() else ""


# ---------------------------------------------------------------------------- /version


def version_url(target: Target) -> str:
    """``/version`` next to ``/metrics`` (so a path prefix behind a proxy is kept)."""
    parts = urlsplit(target.url)
    if parts.path.endswith("/metrics"):
        path = parts.path[: -len("/metrics")] + "/version"
        return urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return target.base_url + "/version"


async def read_version(
    session: aiohttp.ClientSession, target: Target, *, timeout_s: float = VERSION_TIMEOUT_S,
    verify: bool = True,
) -> str | None:
    """The server's version from ``GET /version`` (vLLM: ``{"version": "0.x.y"}``), or None
    when it has no such route or answers anything else."""
    try:
        data = await within(timeout_s, _fetch_version(session, target, verify))
        parsed = json.loads(data)
    except Exception:
        return None
    value = parsed.get("version") if isinstance(parsed, dict) else None
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        return None
    return mask(value.strip(), target.secrets)[:64]  # masked before it is cut


async def _fetch_version(session: aiohttp.ClientSession, target: Target,
                         verify: bool = True) -> bytes:
    url = version_url(target)
    async with session.get(url, headers=request_headers(target), max_redirects=MAX_REDIRECTS,
                           ssl=tls_for(target, verify)) as r:
        if r.status != 200:
            return b""
        return bytes(await read_capped(r, VERSION_MAX_BYTES))


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
