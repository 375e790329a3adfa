"""A small OpenAI-shaped server on 127.0.0.1 whose answers a test controls: errors on given
attempts, hanging or slow streams, streams without usage, and a log of when each request
arrived, what it asked and how many were in flight. For what the simulator cannot be made to do."""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

MODEL = "fake-model"


@dataclass
class FakeOpenAI:
    tokens: int = 4  # per answer, unless the request asks for fewer
    token_gap_s: float = 0.0  # between chunks
    usage: bool = True  # continuous usage on every chunk, and a usage chunk
    fail_status: dict[int, int] = field(default_factory=dict)  # request number -> HTTP status
    hang: bool = False  # accept, then never answer
    cut_after: int | None = None  # close the stream after this many chunks
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() per POST
    bodies: list[dict[str, object]] = field(default_factory=list)  # each POST's JSON body
    paths: list[str] = field(default_factory=list)  # each POST's path
    authorizations: list[str | None] = field(default_factory=list)  # each request's header
    models: tuple[str, ...] = (MODEL,)  # what /v1/models lists
    metrics: str | None = None  # served at /metrics (and the narrowed /metrics/?...) if set
    metrics_requests: list[tuple[str, str | None]] = field(default_factory=list)  # path, auth
    ssl_context: ssl.SSLContext | None = None  # serve HTTPS
    in_flight: int = 0
    max_in_flight: int = 0
    _runner: web.AppRunner | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeOpenAI:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)  # answered alike
        if self.metrics is not None:
            app.router.add_get("/metrics", self._metrics)
            app.router.add_get("/metrics/", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics_requests.append((request.path_qs, request.headers.get("Authorization")))
        return web.Response(text=self.metrics, content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        self.authorizations.append(request.headers.get("Authorization"))
        return web.json_response({"object": "list", "data": [
            {"id": model, "object": "model", "max_model_len": 2048} for model in self.models]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append(time.monotonic())
        number = len(self.arrivals)
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        self.paths.append(request.path)
        self.authorizations.append(request.headers.get("Authorization"))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if number in self.fail_status:
                status = self.fail_status[number]
                return web.json_response({"error": {"message": f"refused {number}",
                                                    "code": status}}, status=status)
            if self.hang:
                await asyncio.Event().wait()
            return await self._stream(request, min(self.tokens, body["max_tokens"]))
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, tokens: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n in range(1, tokens + 1):
            if self.token_gap_s:
                await asyncio.sleep(self.token_gap_s)
            if self.cut_after is not None and n > self.cut_after:
                request.transport.close()  # type: ignore[union-attr]
                return response
            chunk = {"choices": [{"index": 0, "text": " x",
                                  "finish_reason": "length" if n == tokens else None}]}
            if self.usage:
                chunk["usage"] = {"prompt_tokens": 3, "completion_tokens": n}
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if self.usage:
            final = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}}
            await response.write(b"data: " + orjson.dumps(final) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response
