"""An inference server whose OpenAI API is hostile: its /metrics and /version are a real vLLM
0.33's, but its completions quote the Authorization header back (in an HTTP error, in an
event of the stream, in its finish reason) with escape sequences and markup around it, or
send one ``data:`` line that never ends. For ``kvtop rehearse`` and ``baseline --probe``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from tests.hostile.hostile import EVIL_ERROR, healthy_body

MODEL = "hostile-model"
ENDLESS_CHUNK = b"x" * 65536


@dataclass
class HostileAPI:
    """``mode``: "echo" (every request answered with the header quoted back, in turn as an
    HTTP 500, an error event and a finish reason) or "endless" (a 200 stream whose first
    line never ends)."""

    mode: str = "echo"
    requests: int = 0
    seen_auth: list[str] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    async def __aenter__(self) -> HostileAPI:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.33.0"})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=healthy_body(), content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        return web.json_response({"object": "list", "data": [
            {"id": MODEL, "object": "model", "max_model_len": 4096},
            {"id": f"m {auth}", "object": "model"}]})  # a model named after the header

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        auth = request.headers.get("Authorization", "")
        self.seen_auth.append(auth)
        await request.read()
        if self.mode == "endless":
            return await self._endless(request)
        bare = auth.removeprefix("Bearer ")
        said = f"you sent {auth} (token {bare}) {EVIL_ERROR}"
        turn = self.requests % 3
        if turn == 0:
            return web.json_response({"error": {"message": said}}, status=500)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if turn == 1:
            event = {"error": {"message": said}}
        else:
            event = {"choices": [{"index": 0, "text": " x", "finish_reason": bare}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
        await response.write(b"data: " + orjson.dumps(event) + b"\n\ndata: [DONE]\n\n")
        return response

    async def _endless(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: ")
        while True:  # one line, never ended, as fast as the client reads
            await response.write(ENDLESS_CHUNK)
            await asyncio.sleep(0)
