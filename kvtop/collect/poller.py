"""Read many servers' ``/metrics`` at once: one shared httpx client, one task per target.

Every attempt becomes a :class:`~kvtop.collect.target.Scrape`; nothing here raises on a bad
server. Failures are classified as follows (``Scrape.failure``):

==============  ===========================================================================
``down``        connection refused, DNS failure, reset or closed before any answer, TLS
                failure, HTTP 5xx except 501 (the status and the server's message are in
                ``error``)
``timeout``     no complete answer within ``timeout_s`` (a total deadline: a server
                dribbling bytes times out as surely as one that never answers)
``auth``        HTTP 401 / 403, with a hint on where the token goes
``bad_payload`` an answer that is not a usable exposition: 404 or 501 (no metrics there),
                other 4xx, a redirect loop, a body over ``max_bytes`` (decoded size, so a
                gzip bomb is caught), a body cut short, empty, HTML, binary, not UTF-8, or
                not starting like Prometheus text
==============  ===========================================================================

Schedule (``Poller.run``): each target has its own task; an attempt starts ``interval_s``
after the previous one *started* (or right after it ended when it ran longer), so attempts
for one target never overlap. A failing target backs off: the n-th consecutive failure waits
``interval * 2**(n-1)`` (±20 % jitter, never under ``interval``, at most ``max_backoff_s``);
the first success resets it.

The poller belongs to one event loop (the aiohttp session binds to it): create it anywhere,
use and close it in one loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import random
import re
import socket
import ssl
import sys
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from kvtop import __version__
from kvtop.collect.target import FailureKind, Scrape, Target

try:  # ~5x less CPU per scrape than httpx's own transport (reference/performance-notes.md)
    import aiohttp
    from httpx_aiohttp import AiohttpTransport
except ImportError:  # pragma: no cover - exercised only where the package is missing
    aiohttp = None  # type: ignore[assignment]
    AiohttpTransport = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_INTERVAL_S = 1.0
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BACKOFF_S = 30.0
VERSION_TIMEOUT_S = 2.0
VERSION_MAX_BYTES = 64 * 1024
ERROR_SNIPPET_BYTES = 2048
MIN_INTERVAL_S = 0.05

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


class _Failed(Exception):
    """A classified failure raised inside one attempt and turned into a Scrape."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind
        self.message = message


# ---------------------------------------------------------------------------- client


def make_client(*, insecure: bool = False, use_aiohttp: bool = True) -> httpx.AsyncClient:
    """The shared client: aiohttp transport when available, TLS verified unless ``insecure``.

    Proxies from the environment are ignored (kvtop reads servers directly); SSL_CERT_FILE /
    SSL_CERT_DIR are honoured for verification.
    """
    verify: ssl.SSLContext | bool = False if insecure else _verified_context()
    # Many targets share the client and a hung one holds a connection until its deadline,
    # so the pool must not be the bottleneck. Keep-alive expires before uvicorn's 5 s.
    limits = httpx.Limits(
        max_connections=4096, max_keepalive_connections=4096, keepalive_expiry=4.0
    )
    options: dict[str, Any] = {
        "headers": {"Accept-Encoding": "gzip", "User-Agent": f"kvtop/{__version__}"},
        "follow_redirects": True,  # some vLLM builds answered /metrics with 307 /metrics/
        "max_redirects": 3,
        "trust_env": False,
        "limits": limits,
    }
    if use_aiohttp and AiohttpTransport is not None:
        transport = AiohttpTransport(verify=verify, limits=limits, trust_env=False)
        return httpx.AsyncClient(transport=transport, **options)
    return httpx.AsyncClient(verify=verify, **options)


@functools.lru_cache(maxsize=1)
def _verified_context() -> ssl.SSLContext:
    """Loading the CA bundle costs ~0.1 s; one context serves every client."""
    return httpx.create_ssl_context()


# ---------------------------------------------------------------------------- one scrape


async def scrape(
    client: httpx.AsyncClient,
    target: Target,
    *,
    timeout_s: float = 5.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Scrape:
    """One GET of ``target.url``; every outcome, good or bad, is a Scrape (never raises)."""
    started_wall, started = time.time(), time.perf_counter()
    result = Scrape(target=target, t=started_wall)
    try:
        result.body = await _within(timeout_s, _fetch(client, target, timeout_s, max_bytes))
    except _Failed as failed:
        result.failure, result.error = failed.kind, failed.message
    except Exception as exc:
        result.failure, result.error = classify_exception(exc, timeout_s)
        log.debug("scrape of %s failed", target.label, exc_info=True)
    result.duration_s = time.perf_counter() - started
    secret = target.token.reveal() if target.token is not None else ""
    if result.error and secret:  # a server may echo the header back
        result.error = result.error.replace(secret, "***")
    return result


async def _fetch(
    client: httpx.AsyncClient, target: Target, timeout_s: float, max_bytes: int
) -> str:
    async with client.stream(
        "GET", target.url, headers=_auth_headers(target), timeout=timeout_s
    ) as response:
        if not 200 <= response.status_code < 300:
            raise await _status_failure(response, target)
        declared = _content_length(response)
        if declared is not None and declared > max_bytes:
            raise _Failed("bad_payload", _over_cap(max_bytes, f"Content-Length {declared:,}"))
        data = await _read_body(response, max_bytes)
    return _decode_text(data, response.headers.get("content-type", ""))


def _auth_headers(target: Target) -> dict[str, str] | None:
    if target.token is None:
        return None
    return {"Authorization": f"Bearer {target.token.reveal()}"}


async def _read_body(response: httpx.Response, max_bytes: int) -> bytearray:
    """The body within the cap; a connection lost mid-body is a bad payload, not 'down'."""
    try:
        return await read_capped(response, max_bytes)
    except _Failed:
        raise
    except Exception as exc:
        if classify_exception(exc)[0] == "timeout":
            raise
        raise _Failed("bad_payload", "response cut short: the connection closed mid-body") from exc


async def read_capped(response: httpx.Response, max_bytes: int) -> bytearray:
    """Stream a response, decoding gzip/deflate here so the cap counts decoded bytes."""
    decoder = _decoder(response.headers.get("content-encoding", ""))
    buf = bytearray()
    async for chunk in response.aiter_raw():
        if decoder is not None:
            # max_length bounds the output of one chunk: a bomb never inflates past the cap.
            chunk = decoder.decompress(chunk, max_bytes - len(buf) + 1)
        buf += chunk
        if len(buf) > max_bytes:
            raise _Failed("bad_payload", _over_cap(max_bytes, "the body"))
    if decoder is not None and not decoder.eof:
        raise _Failed("bad_payload", "response cut short: the compressed body ended early")
    return buf


def _decoder(encoding: str) -> Any:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise _Failed("bad_payload", f"unsupported Content-Encoding {encoding[:40]!r}")


def _over_cap(max_bytes: int, what: str) -> str:
    return f"{what} is over the {max_bytes:,}-byte size cap; dropped (raise the cap if it is real)"


def _content_length(response: httpx.Response) -> int | None:
    try:
        return int(response.headers["content-length"])
    except (KeyError, ValueError):
        return None


def _decode_text(data: bytearray, content_type: str) -> str:
    if not data or data.isspace():
        raise _Failed("bad_payload", "empty body: the server answered with no metrics")
    if "html" in content_type.lower() or data[:64].lstrip()[:1] == b"<":
        raise _Failed(
            "bad_payload", "an HTML page, not metrics (a login page, proxy or web UI at this URL?)"
        )
    if b"\x00" in data:
        raise _Failed("bad_payload", "binary data, not Prometheus text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Failed("bad_payload", f"not UTF-8 text (bad byte at offset {exc.start:,})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not _TEXT_START.match(data, 3 if data.startswith(b"\xef\xbb\xbf") else 0):
        first = text.lstrip()[:40]
        raise _Failed("bad_payload", f"not Prometheus text: it starts with {first!r}")
    return text


# ---------------------------------------------------------------------------- HTTP status


async def _status_failure(response: httpx.Response, target: Target) -> _Failed:
    status = response.status_code
    if status == 401:
        return _Failed("auth", HINT_401_TOKEN if target.token is not None else HINT_401_NO_TOKEN)
    if status == 403:
        return _Failed("auth", HINT_403)
    if status == 404:
        return _Failed("bad_payload", HINT_404)
    said = await _server_message(response)
    if status == 501:
        return _Failed("bad_payload", f"{HINT_501}{said}")
    if status >= 500:
        return _Failed("down", f"HTTP {status}: the server is failing or not ready{said}")
    if 300 <= status < 400:
        return _Failed("bad_payload", f"HTTP {status}: a redirect kvtop could not follow{said}")
    return _Failed("bad_payload", f"HTTP {status}: not a metrics answer{said}")


async def _server_message(response: httpx.Response) -> str:
    """A short quote of an error body (JSON message, HTML title or first text), or ''."""
    try:
        raw = await read_capped(response, ERROR_SNIPPET_BYTES)
    except Exception:  # too long or broken: the status alone will do
        return ""
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        inner = parsed.get("error", parsed)
        for key in ("message", "detail", "error"):
            value = inner.get(key) if isinstance(inner, dict) else None
            if isinstance(value, str):
                text = value
                break
    elif match := _HTML_TITLE.search(text):
        text = match.group(1)
    text = " ".join(text.split())[:120]
    return f" ({text})" if text and text.isprintable() else ""


# ---------------------------------------------------------------------------- exceptions


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 8:
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return chain


def classify_exception(
    exc: BaseException, timeout_s: float | None = None
) -> tuple[FailureKind, str]:
    """(kind, readable reason) for an exception from one request; the whole cause chain
    counts, because httpx-aiohttp maps a server disconnect to ``httpx.ConnectTimeout``."""
    try:
        return _classify(_causes(exc), exc, timeout_s)
    except Exception:  # exception classes with odd attributes must not escape
        return "down", f"cannot read the server: {type(exc).__name__}"


def _classify(
    chain: list[BaseException], exc: BaseException, timeout_s: float | None
) -> tuple[FailureKind, str]:
    if any(isinstance(e, httpx.TooManyRedirects) for e in chain):
        return "bad_payload", "redirect loop: too many redirects"
    for e in chain:
        if isinstance(e, ssl.SSLCertVerificationError):
            return "down", _untrusted(_text(e))
        if isinstance(e, ssl.SSLError):
            return "down", _handshake_failed(getattr(e, "reason", None) or _text(e))
        if isinstance(e, socket.gaierror):
            return "down", "DNS lookup failed: unknown host"
        if isinstance(e, ConnectionRefusedError):
            return "down", "connection refused: nothing listens on that port"
    from_aiohttp = aiohttp is not None and any(isinstance(e, aiohttp.ClientError) for e in chain)
    if any(isinstance(e, (TimeoutError, asyncio.TimeoutError)) for e in chain) or (
        isinstance(exc, httpx.TimeoutException) and not from_aiohttp
    ):
        within = f" within {timeout_s:g} s" if timeout_s else ""
        return "timeout", f"no complete answer{within}"
    return "down", _describe(chain)


def _untrusted(text: str) -> str:
    detail = text.split("certificate verify failed:")[-1].split("(_ssl")[0].strip(" ')]")
    return (
        f"TLS certificate not trusted ({detail}); pass --insecure to skip verification "
        "or point SSL_CERT_FILE at your CA"
    )


def _handshake_failed(detail: str) -> str:
    return f"TLS handshake failed ({detail}); does the server speak https?"


def _describe(chain: list[BaseException]) -> str:
    """The most specific readable message in the chain."""
    closed = "the server closed the connection without answering"
    if aiohttp is not None and any(isinstance(e, aiohttp.ServerDisconnectedError) for e in chain):
        return closed
    for e in chain:
        if isinstance(e, httpx.ConnectError):  # httpcore drops the OSError behind it
            text = _text(e)
            if "CERTIFICATE_VERIFY_FAILED" in text:
                return _untrusted(text)
            if "[SSL" in text:
                return _handshake_failed(text)
            if "Name or service not known" in text or "nodename nor servname" in text:
                return "DNS lookup failed: unknown host"
            if "All connection attempts failed" in text:
                return "cannot connect: connection refused or host unreachable"
            return f"cannot connect: {text}"
        if isinstance(e, ConnectionResetError):
            return "connection reset by the server"
        if isinstance(e, httpx.RemoteProtocolError):
            text = _text(e)
            return closed if "without sending a response" in text else f"broken HTTP answer: {text}"
        if isinstance(e, httpx.UnsupportedProtocol):
            return f"unsupported URL: {_text(e)}"
    root = chain[-1]
    return f"cannot read the server: {_text(root)}"


def _text(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return text or type(exc).__name__


# ---------------------------------------------------------------------------- /version


def version_url(target: Target) -> str:
    """``/version`` next to ``/metrics`` (so a path prefix behind a proxy is kept)."""
    parts = urlsplit(target.url)
    if parts.path.endswith("/metrics"):
        path = parts.path[: -len("/metrics")] + "/version"
        return urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return target.base_url + "/version"


async def read_version(
    client: httpx.AsyncClient, target: Target, *, timeout_s: float = VERSION_TIMEOUT_S
) -> str | None:
    """The server's version from ``GET /version`` (vLLM: ``{"version": "0.x.y"}``), or None
    when it has no such route or answers anything else."""
    try:
        data = await _within(timeout_s, _fetch_version(client, target, timeout_s))
        parsed = json.loads(data)
    except Exception:
        return None
    value = parsed.get("version") if isinstance(parsed, dict) else None
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        return None
    return value.strip()[:64]


async def _fetch_version(client: httpx.AsyncClient, target: Target, timeout_s: float) -> bytes:
    url = version_url(target)
    async with client.stream("GET", url, headers=_auth_headers(target), timeout=timeout_s) as r:
        if r.status_code != 200:
            return b""
        return bytes(await read_capped(r, VERSION_MAX_BYTES))


# ---------------------------------------------------------------------------- the poller


@dataclass(slots=True)
class PollState:
    """What the poller remembers about one target between attempts."""

    failures: int = 0  # consecutive failed attempts; 0 after a success
    version: str | None = None
    last_ok_t: float | None = None  # unix time of the last successful scrape
    next_due: float | None = None  # loop.time() of the next planned attempt
    need_version: bool = True
    jitter: float = 1.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)


def backoff_delay(
    failures: int, interval_s: float, max_backoff_s: float, jitter: float = 1.0
) -> float:
    """Seconds from one attempt's start to the next: ``interval_s`` while healthy, doubling
    per consecutive failure (times ``jitter``), never under the interval nor over the cap."""
    if failures <= 0:
        return interval_s
    cap = max(max_backoff_s, interval_s)
    base = interval_s * 2.0 ** min(failures - 1, 30)
    return max(interval_s, min(cap, base * jitter))


OnScrape = Callable[[Scrape], "Awaitable[None] | None"]


class Poller:
    """Polls many targets concurrently through one shared client.

    ``timeout_s`` defaults to ``clamp(2 × interval, 2 s, 5 s)``, following the interval when
    it changes: a loaded vLLM can take over a second to render /metrics (its GIL is busy),
    so at 1 Hz a 1 s timeout would flap, while 5 s still flags a dead host quickly. A long
    timeout slows only the target it hits.
    """

    def __init__(
        self,
        targets: Iterable[Target],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        insecure: bool = False,
        max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
        client: httpx.AsyncClient | None = None,
        seed: int | None = None,
    ) -> None:
        # As given, so poll_once answers one Scrape per entry; a duplicate shares its state
        # and run() polls it once.
        self._targets: list[Target] = list(targets)
        self._states = {t: PollState() for t in self._targets}
        self._interval_s = _valid_interval(interval_s)
        self._timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_backoff_s = max_backoff_s
        self._owns_client = client is None
        self.client = client if client is not None else make_client(insecure=insecure)
        self._rng = random.Random(seed)
        self._wake = asyncio.Event()
        self._tasks: dict[Target, asyncio.Task[None]] = {}
        self._on_scrape: OnScrape | None = None

    # -- settings ---------------------------------------------------------------------

    @property
    def interval_s(self) -> float:
        return self._interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        """Takes effect at once: sleeping targets wake and re-plan with the new interval."""
        self._interval_s = _valid_interval(value)
        self._wake.set()
        self._wake = asyncio.Event()

    @property
    def timeout_s(self) -> float:
        if self._timeout_s is not None:
            return self._timeout_s
        return min(5.0, max(2.0, 2.0 * self._interval_s))

    @timeout_s.setter
    def timeout_s(self, value: float | None) -> None:
        self._timeout_s = value

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(self._targets)

    def state(self, target: Target) -> PollState:
        return self._states[target]

    def add_target(self, target: Target) -> None:
        """Start polling ``target`` (at once when ``run`` is going); a known one is ignored."""
        if target in self._states:
            return
        self._targets.append(target)
        self._states[target] = PollState()
        if self._on_scrape is not None:
            self._tasks[target] = asyncio.create_task(self._loop(target, self._on_scrape))

    def remove_target(self, target: Target) -> None:
        """Stop polling ``target``; its attempt in flight, if any, is cancelled."""
        if target not in self._states:
            return
        self._targets = [t for t in self._targets if t != target]
        del self._states[target]
        task = self._tasks.pop(target, None)
        if task is not None:
            task.cancel()

    # -- polling ----------------------------------------------------------------------

    async def poll_once(self) -> list[Scrape]:
        """Every target once, concurrently; one result per target given, in their order."""
        return list(await asyncio.gather(*(self._attempt(t) for t in self._targets)))

    async def run(self, on_scrape: OnScrape, *, stop: asyncio.Event | None = None) -> None:
        """Poll every target on its own schedule, calling ``on_scrape`` after each attempt,
        until ``stop`` is set or this coroutine is cancelled."""
        if self._on_scrape is not None:
            raise RuntimeError("Poller.run is already running")
        self._on_scrape = on_scrape
        self._tasks = {t: asyncio.create_task(self._loop(t, on_scrape)) for t in self._states}
        try:
            await (stop or asyncio.Event()).wait()
        finally:
            self._on_scrape = None
            tasks = list(self._tasks.values())
            self._tasks.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, target: Target, on_scrape: OnScrape) -> None:
        loop = asyncio.get_running_loop()
        while target in self._states:
            started = loop.time()
            try:
                result = await self._attempt(target)
                await _deliver(on_scrape, result)
            except Exception:  # a bug must not stop this target's polling
                log.exception("polling %s failed", target.label)
            await self._pause(target, started)

    async def _attempt(self, target: Target) -> Scrape:
        state = self._states.get(target) or PollState()
        async with state.lock:  # poll_once during run never overlaps an attempt
            result = await scrape(
                self.client, target, timeout_s=self.timeout_s, max_bytes=self.max_bytes
            )
            if result.ok:
                if state.need_version:  # first success, or first after a failure
                    state.version = await read_version(
                        self.client, target, timeout_s=min(VERSION_TIMEOUT_S, self.timeout_s)
                    )
                    state.need_version = False
                result.version = state.version
                state.failures, state.last_ok_t = 0, result.t
            else:
                state.failures += 1
                state.need_version = True
                state.jitter = self._rng.uniform(0.8, 1.2)
        return result

    async def _pause(self, target: Target, started: float) -> None:
        """Sleep until the next attempt is due, re-planning when the interval changes."""
        loop = asyncio.get_running_loop()
        while (state := self._states.get(target)) is not None:
            delay = backoff_delay(
                state.failures, self._interval_s, self.max_backoff_s, state.jitter
            )
            state.next_due = started + delay
            remaining = state.next_due - loop.time()
            if remaining <= 0:
                return
            try:
                await _within(remaining, self._wake.wait())
            except (TimeoutError, asyncio.TimeoutError):
                return

    # -- lifetime ---------------------------------------------------------------------

    async def aclose(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> Poller:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _deliver(on_scrape: OnScrape, result: Scrape) -> None:
    try:
        outcome = on_scrape(result)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:  # the consumer's bug must not stop polling
        log.exception("on_scrape failed for %s", result.target.label)


def _valid_interval(value: float) -> float:
    value = float(value)
    if not value > 0:  # also rejects NaN
        raise ValueError(f"interval must be > 0 s, got {value}")
    return max(MIN_INTERVAL_S, value)


if sys.version_info >= (3, 11):

    async def _within(seconds: float, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` with a total deadline (raises TimeoutError)."""
        async with asyncio.timeout(seconds):
            return await coro

else:  # pragma: no cover - Python 3.10

    async def _within(seconds: float, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wait_for(coro, seconds)
