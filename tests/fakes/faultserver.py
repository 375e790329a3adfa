"""A real HTTP/1.1 server on 127.0.0.1 that serves /metrics fixtures and injects faults.

It is a raw asyncio server, not a framework, so it can lie: cut a body short, dribble bytes,
claim a Content-Length it never sends, stream 50 MB or a gzip bomb.

Routes (any path, so ``/version`` next to ``/m/<mode>/metrics`` works too):

* ``/metrics`` (or any other path): the server's current ``mode`` (mutable: tests switch
  it between scrapes).
* ``/m/<mode>/metrics``: that mode, whatever the current one; ``?s=0.5`` style query
  arguments reach the handler (``slow`` and ``dribble`` read ``s``).
* ``.../version``: ``{"version": <version>}``, or 404 when ``version`` is None; or the
  mode ``version_mode`` when set (``"hang"``: a server that never answers it).
* a path ending in ``/`` (kvtop's narrowed read, ``/metrics/?name[]=…``): ``slash_mode``
  when set, so a test can make a server that cannot filter; else as above.

Modes: see ``MODES`` (``ok`` serves ``bodies`` in turn, sticking on the last, which is how a
counter reset between two scrapes is served). Add one with ``@mode("name")``::

    @mode("teapot")
    async def _teapot(srv, req, w):
        return await srv.respond(w, 418, b"I'm a teapot")

A handler returns True to keep the connection alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import random
import socket
import ssl
import struct
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import parse_qsl, urlsplit

from tests.support.paths import FIXTURES

DEFAULT_FIXTURE = "vllm-0.33.0-v1-twin-under-load.txt"
BIG_BYTES = 50 * 1024 * 1024
CHUNK = 64 * 1024
TEXT = "text/plain; version=0.0.4; charset=utf-8"
REASONS = {
    200: "OK", 307: "Temporary Redirect", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 500: "Internal Server Error", 501: "Not Implemented",
    503: "Service Unavailable",
}  # fmt: skip


def fixture(name: str = DEFAULT_FIXTURE) -> bytes:
    """A real /metrics text from tests/fixtures/metrics."""
    return (FIXTURES / name).read_bytes()


def closed_port() -> int:
    """A port nothing listens on (bound then released), for 'connection refused'. Another
    process may take it later: for a target that must stay refused, use refused_port()."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port that refuses connections while the block lasts: bound but never listening,
    so no server of another test (an xdist worker's) can take it in the meantime."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@contextlib.contextmanager
def served_in_thread(server: FaultServer) -> Iterator[FaultServer]:
    """``server`` running in a thread's event loop, for a command that runs its own loop
    (``asyncio.run``) in the test's thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(20)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(20)


@lru_cache(maxsize=1)
def gzip_bomb() -> bytes:
    """~50 KB of valid gzip that inflates to 50 MB of zeros, built in milliseconds: after a
    full flush, compressing the same 1 MiB again yields the same bytes, so they repeat."""
    chunk = b"\0" * (1 << 20)
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    first = packer.compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)
    block = packer.compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)
    end = packer.flush()[:-8]  # the last block, without the trailer for 2 MiB
    crc = 0
    for _ in range(BIG_BYTES // len(chunk)):
        crc = zlib.crc32(chunk, crc)
    trailer = struct.pack("<II", crc, BIG_BYTES & 0xFFFFFFFF)
    return first + block * (BIG_BYTES // len(chunk) - 1) + end + trailer


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]  # the last value of each argument
    headers: dict[str, str]  # lower-case names
    target: str = ""  # the request target as sent: path and the whole query
    body: bytes = b""
    at: float = field(default_factory=time.monotonic)  # when its head was read


Handler = Callable[["FaultServer", Request, asyncio.StreamWriter], Awaitable[bool]]
MODES: dict[str, Handler] = {}


def mode(name: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        MODES[name] = handler
        return handler

    return register


@dataclass
class FaultServer:
    mode: str = "ok"
    bodies: Sequence[bytes] = field(default_factory=lambda: [fixture()])
    version: str | None = "0.33.0"
    version_body: bytes | None = None  # served raw by /version instead, when set
    version_mode: str | None = None  # the mode that answers /version instead, when set
    token: str | None = None  # mode "auth" wants "Bearer <token>"
    slash_mode: str | None = None  # the mode for paths ending in "/", when set
    delay_s: float = 0.5  # default for "slow"
    ssl_context: ssl.SSLContext | None = None  # serve HTTPS
    api: Callable[[Request], tuple[int, bytes]] | None = None  # mode "api": (status, JSON)
    requests: list[Request] = field(default_factory=list)
    bytes_sent: int = 0
    hits: int = 0  # /metrics requests answered by "ok"
    _server: asyncio.Server | None = None
    _conns: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _closing: asyncio.Event = field(default_factory=asyncio.Event)

    # -- lifetime -----------------------------------------------------------------

    async def start(self) -> FaultServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl_context,
                                                  backlog=1024)  # hundreds connect at once
        return self

    async def close(self) -> None:
        """Stop listening and hang up on every client (a hung handler wakes and returns)."""
        if self._server is not None:
            self._server.close()
        self._closing.set()
        for writer in list(self._writers):
            writer.transport.abort()  # type: ignore[attr-defined]
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=2.0)

    async def __aenter__(self) -> FaultServer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the server first"
        return self._server.sockets[0].getsockname()[1]

    @property
    def base_url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def url(self, mode: str | None = None, query: str = "") -> str:
        """The /metrics URL of ``mode`` (the current mode when None)."""
        path = "/metrics" if mode is None else f"/m/{mode}/metrics"
        return self.base_url + path + (f"?{query}" if query else "")

    # -- HTTP ---------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        self._writers.add(writer)
        try:
            while (request := await _read_request(reader)) is not None:
                self.requests.append(request)
                if not await self._dispatch(request, writer):
                    break
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ):
            pass
        finally:
            self._conns.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _dispatch(self, req: Request, w: asyncio.StreamWriter) -> bool:
        if req.path.endswith("/version"):
            if self.version_mode is not None:
                return await MODES[self.version_mode](self, req, w)
            return await self._version(w)
        parts = req.path.strip("/").split("/")
        name = parts[1] if len(parts) == 3 and parts[0] == "m" else self.mode
        if self.slash_mode is not None and req.path.endswith("/"):
            name = self.slash_mode
        return await MODES[name](self, req, w)

    async def _version(self, w: asyncio.StreamWriter) -> bool:
        if self.version_body is not None:
            return await self.respond(w, 200, self.version_body, content_type="application/json")
        if self.version is None:
            return await self.respond(w, 404, b'{"detail":"Not Found"}')
        body = json.dumps({"version": self.version}).encode()
        return await self.respond(w, 200, body, content_type="application/json")

    async def respond(
        self,
        w: asyncio.StreamWriter,
        status: int,
        body: bytes = b"",
        *,
        content_type: str = TEXT,
        headers: dict[str, str] | None = None,
        length: int | None = None,
    ) -> bool:
        """Send a whole response; ``length`` overrides the Content-Length sent."""
        await self.send_head(w, status, content_type, {"Content-Length": str(
            len(body) if length is None else length), **(headers or {})})  # fmt: skip
        await self.send(w, body)
        return length is None

    async def send_head(
        self, w: asyncio.StreamWriter, status: int, content_type: str, headers: dict[str, str]
    ) -> None:
        lines = [
            f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}",
            f"Content-Type: {content_type}",
        ]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        await self.send(w, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def pause(self, seconds: float) -> bool:
        """Sleep; False (at once) when the server is closing."""
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)
        return not self._closing.is_set()

    async def send(self, w: asyncio.StreamWriter, data: bytes) -> None:
        w.write(data)
        self.bytes_sent += len(data)
        await w.drain()


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on a connection, or None at its end or on nonsense (TLS, junk)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    request_line = lines[0].split(" ")
    if len(request_line) != 3:
        return None
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    body = await _read_body(reader, headers)  # or its bytes would be read as the next request
    parts = urlsplit(request_line[1])
    return Request(request_line[0], parts.path, dict(parse_qsl(parts.query)), headers,
                   request_line[1], body)


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    body = b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")  # no trailers are sent by the clients under test
    elif length := int(headers.get("content-length", "0") or 0):
        body = await reader.readexactly(length)
    return body


# ---------------------------------------------------------------------------- modes


@mode("ok")
async def _ok(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    body = srv.bodies[min(srv.hits, len(srv.bodies) - 1)]
    srv.hits += 1
    return await srv.respond(w, 200, body)


@mode("gzip")
async def _gzip(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    body = gzip.compress(srv.bodies[0])
    return await srv.respond(w, 200, body, headers={"Content-Encoding": "gzip"})


@mode("hang")
async def _hang(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    await srv._closing.wait()
    return False


@mode("slow")
async def _slow(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    if not await srv.pause(float(req.query.get("s", srv.delay_s))):
        return False
    return await srv.respond(w, 200, srv.bodies[0])


@mode("dribble")
async def _dribble(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """Headers at once, then one byte every ``s`` seconds: each read is quick, the whole never."""
    body = srv.bodies[0]
    await srv.send_head(w, 200, TEXT, {"Content-Length": str(len(body))})
    for i in range(len(body)):
        await srv.send(w, body[i : i + 1])
        if not await srv.pause(float(req.query.get("s", 0.05))):
            return False
    return True


@mode("auth")
async def _auth(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    if srv.token is not None and req.headers.get("authorization") == f"Bearer {srv.token}":
        return await srv.respond(w, 200, srv.bodies[0])
    return await srv.respond(w, 401, b'{"error": "Unauthorized"}', content_type="application/json")


@mode("forbidden")
async def _forbidden(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    return await srv.respond(w, 403, b"Forbidden")


@mode("error500")
async def _error500(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    return await srv.respond(w, 500, b"Internal Server Error")


@mode("loading")
async def _loading(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """llama.cpp while it loads a model."""
    body = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
    return await srv.respond(w, 503, body, content_type="application/json")


@mode("notfound")
async def _notfound(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    return await srv.respond(w, 404, b'{"detail":"Not Found"}', content_type="application/json")


@mode("nometrics")
async def _nometrics(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """llama.cpp started without --metrics."""
    body = (
        b'{"error":{"code":501,"message":"This server does not support metrics endpoint. '
        b'Start it with `--metrics`","type":"not_supported_error"}}'
    )
    return await srv.respond(w, 501, body, content_type="application/json")


@mode("redirect")
async def _redirect(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    return await srv.respond(w, 307, headers={"Location": "/m/ok/metrics"})


@mode("redirect_loop")
async def _redirect_loop(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    return await srv.respond(w, 307, headers={"Location": "/m/redirect_loop/metrics"})


@mode("garbage")
async def _garbage(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    return await srv.respond(w, 200, random.Random(0).randbytes(4096))


@mode("latin1")
async def _latin1(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    body = b'# HELP x y\nkv_usage{model_name="caf\xe9"} 0.5\n'
    return await srv.respond(w, 200, body)


@mode("json")
async def _json(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    return await srv.respond(w, 200, b'{"status": "ok"}', content_type="application/json")


@mode("html")
async def _html(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    body = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>login</body></html>"
    return await srv.respond(w, 200, body, content_type="text/html; charset=utf-8")


@mode("empty")
async def _empty(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    return await srv.respond(w, 200, b"")


@mode("truncated")
async def _truncated(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """Claims the whole body, sends half, closes."""
    body = srv.bodies[0]
    return await srv.respond(w, 200, body[: len(body) // 2], length=len(body))


@mode("reset")
async def _reset(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """Reads the request and hangs up without a word."""
    return False


@mode("big")
async def _big(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """50 MB, honestly announced by Content-Length."""
    await srv.send_head(w, 200, TEXT, {"Content-Length": str(BIG_BYTES)})
    return await _stream_big(srv, w)


@mode("big_unannounced")
async def _big_unannounced(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """50 MB without a length (read until close): only a streaming cap stops it."""
    await srv.send_head(w, 200, TEXT, {"Connection": "close"})
    await _stream_big(srv, w)
    return False


async def _stream_big(srv: FaultServer, w: asyncio.StreamWriter) -> bool:
    line = b'vllm:num_requests_running{engine="0",model_name="x"} 1.0\n'
    chunk = line * (CHUNK // len(line))
    sent = 0
    while sent < BIG_BYTES:  # generated on the fly; drain() stops us when the client quits
        piece = chunk[: BIG_BYTES - sent]
        await srv.send(w, piece)
        sent += len(piece)
    return True


@mode("gzip_bomb")
async def _gzip_bomb(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    return await srv.respond(w, 200, gzip_bomb(), headers={"Content-Encoding": "gzip"})


@mode("api")
async def _api(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """An HTTP API (a fake Prometheus): ``srv.api`` answers each request."""
    assert srv.api is not None, "mode 'api' needs FaultServer(api=...)"
    status, body = srv.api(req)
    return await srv.respond(w, status, body, content_type="application/json")


@mode("deflate_raw")
async def _deflate_raw(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """'Content-Encoding: deflate' must be zlib-wrapped; some servers send raw deflate."""
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = packer.compress(srv.bodies[0]) + packer.flush()
    return await srv.respond(w, 200, body, headers={"Content-Encoding": "deflate"})


@mode("gzip_corrupt")
async def _gzip_corrupt(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """gzip whose last block fails its CRC check."""
    body = bytearray(gzip.compress(srv.bodies[0]))
    body[-8] ^= 0xFF  # the CRC-32 in the trailer
    return await srv.respond(w, 200, bytes(body), headers={"Content-Encoding": "gzip"})
