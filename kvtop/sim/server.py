"""Simulated vLLM servers over HTTP on 127.0.0.1, several per process, stepping in the
background on the event loop.

Each `SimServer` owns a `Simulation` whose clock follows wall time times `speed`; it
serves `/metrics`, `/health`, `/version`, `/v1/models`, `/v1/completions` and
`/v1/chat/completions` like vLLM's OpenAI server (SGLang mode: no `/version`); requests
sent to the API run in the simulated engine beside the workload (`openai_api.py`).
Like vLLM 0.33, `/metrics` renders everything uncompressed
(prometheus-fastapi-instrumentator's route) and `/metrics/` is prometheus_client's own
handler: gzip when accepted, and only the samples named by `name[]` arguments, or nothing
at all in the "v0" and "sglang" modes, whose servers use its multiprocess collector.
`SimFleet` starts and stops several at once:

    async with SimFleet([SimConfig(), SimConfig(faults=plan(leak_frac=0.2))]) as fleet:
        fleet.urls                  # ["http://127.0.0.1:41234", ...]
        fleet.servers[1].truth()    # ground truth, never in /metrics
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kvtop.sim.engine import Engine, EngineConfig, RequestSpec
from kvtop.sim.exposition import CONTENT_TYPE, Names, render
from kvtop.sim.faults import Fault, malform
from kvtop.sim.kv_publisher import SimKvPublisher
from kvtop.sim.openai_api import OpenAIRoutes
from kvtop.sim.simulation import Simulation, Truth
from kvtop.sim.workloads import make_workload

HOST = "127.0.0.1"  # never reachable from outside the machine
DEFAULT_VERSIONS = {"v1": "0.33.0", "v0": "0.7.3", "sglang": None}
# prometheus_client's multiprocess collector knows no names: `name[]` selects nothing.
MULTIPROCESS_NAMES = frozenset({"v0", "sglang"})


@dataclass(frozen=True)
class SimConfig:
    model_name: str = "sim-llama-3-8b"
    port: int = 0  # 0: an ephemeral port
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: str = "synthetic"
    workload_params: Mapping[str, Any] = field(default_factory=dict)
    requests: Iterable[RequestSpec] | None = None  # overrides `workload`
    faults: Sequence[Fault] = ()
    names: Names = "v1"
    speed: float = 1.0  # simulated seconds per wall second
    seed: int = 0
    autostep: bool = True  # False: the clock moves only through `simulation.advance_to`
    max_lag: float = 2.0  # wall seconds the simulation may fall behind before it slows
    tick: float = 0.02  # wall seconds between catch-ups
    cpu_share: float = 0.25  # most of each tick the stepping may take
    kv_events_port: int | None = None  # publish KV events here (0: ephemeral); None: off
    kv_events_replay_port: int = 0  # the replay socket's port (0: ephemeral)


class SimServer:
    def __init__(self, config: SimConfig) -> None:
        if config.kv_events_port is not None:
            config = dataclasses.replace(
                config, engine=dataclasses.replace(config.engine, kv_events=True))
        self.config = config
        self.kv_events = (None if config.kv_events_port is None else
                          SimKvPublisher(config.kv_events_port, config.kv_events_replay_port))
        self._published_engine: Engine | None = None
        requests = config.requests
        if requests is None:
            requests = make_workload(config.workload, seed=config.seed,
                                     block_size=config.engine.block_size,
                                     **config.workload_params)
        self.simulation = Simulation(config.engine, requests, config.faults, seed=config.seed)
        self.last_scrape: Truth | None = None  # the truth at the last /metrics render
        self.scrapes = 0
        self.port = config.port
        self._runner: web.AppRunner | None = None
        self._driver: asyncio.Task[None] | None = None
        self._anchor: tuple[float, float] | None = None  # (loop time, sim time) in step
        self._closing = asyncio.Event()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def truth(self) -> Truth:
        return self.simulation.truth()

    def render(self, only: frozenset[str] | None = None) -> str:
        """The `/metrics` body now (or the samples in ``only``), recording the truth it
        shows."""
        self.last_scrape = self.simulation.truth()
        if only is not None and self.config.names in MULTIPROCESS_NAMES:
            return ""
        return render(self.simulation.engine, model_name=self.config.model_name,
                      names=self.config.names, only=only)

    async def start(self, listener: socket.socket | None = None,
                    kv_listeners: tuple[socket.socket, socket.socket] | None = None) -> None:
        """Serve on ``listener`` (a socket already bound and listening), else on the
        config's port; KV events (when on) on ``kv_listeners`` likewise."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/metrics/", self._exposition_handler)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        version = DEFAULT_VERSIONS[self.config.names]
        if version:
            app.router.add_get("/version", self._version)
        OpenAIRoutes(self, f"vllm-{version}-kvtopsim" if version else None).register(app)
        # handler_cancellation: a client that hangs up aborts its request, as in vLLM
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5,
                                     handler_cancellation=True)
        await self._runner.setup()
        site = (web.SockSite(self._runner, listener) if listener is not None
                else web.TCPSite(self._runner, HOST, self.config.port))
        await site.start()
        self.port = self._runner.addresses[0][1]
        if self.kv_events is not None:
            await self.kv_events.start(kv_listeners)
        if self.config.autostep:
            self._driver = asyncio.create_task(self._drive())

    async def stop(self) -> None:
        self._closing.set()  # releases hanging /metrics handlers
        if self._driver is not None:
            self._driver.cancel()
            await asyncio.gather(self._driver, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self.kv_events is not None:
            await self.kv_events.stop()

    def publish_kv_events(self) -> None:
        """Send the engine's KV events since the last call, a batch per step."""
        publisher, engine = self.kv_events, self.simulation.engine
        if publisher is None:
            return
        if self._published_engine is not None and engine is not self._published_engine:
            publisher.restart()  # a restarted server is a new publisher
        self._published_engine = engine
        while engine.kv_batches:
            clock, events = engine.kv_batches.popleft()
            publisher.publish(engine.created + clock, events, self.config.engine.block_size)

    async def _drive(self) -> None:
        """Keep the simulated clock at `speed` times wall time, within a CPU share.

        Each tick steps for at most `cpu_share * tick` seconds, so several servers and a
        UI share one event loop; a simulation that cannot keep up runs slower instead.
        """
        loop = asyncio.get_running_loop()
        speed, tick = self.config.speed, self.config.tick
        wall0, sim0 = self._anchor = loop.time(), self.simulation.clock
        while True:
            target = sim0 + (loop.time() - wall0) * speed
            deadline = time.perf_counter() + self.config.cpu_share * tick
            while not self.simulation.advance_to(target, max_steps=10):
                if time.perf_counter() > deadline:
                    break
            self.publish_kv_events()
            if target - self.simulation.clock > self.config.max_lag * speed:
                wall0, sim0 = self._anchor = loop.time(), self.simulation.clock
            await asyncio.sleep(tick)

    def due_at(self, sim_t: float) -> float:
        """The loop time at which an output made at simulated time `sim_t` leaves: its
        wall time plus one tick (the most the stepping runs behind), so the gaps between a
        stream's tokens keep the engine's timing. Now, when the clock is driven by hand."""
        loop = asyncio.get_running_loop()
        if self._anchor is None:
            return loop.time()
        wall0, sim0 = self._anchor
        return wall0 + (sim_t - sim0) / self.config.speed + self.config.tick

    def authorized(self, request: web.Request) -> bool:
        token = self.simulation.state.token
        return token is None or request.headers.get("Authorization") == f"Bearer {token}"

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        """vLLM's `/metrics`: everything, never compressed."""
        return await self._serve_metrics(request, only=None, compress=False)

    async def _exposition_handler(self, request: web.Request) -> web.StreamResponse:
        """prometheus_client's handler at `/metrics/`: `name[]` filter, gzip."""
        names = request.query.getall("name[]", [])
        only = frozenset(names) if names else None
        return await self._serve_metrics(request, only=only, compress=True)

    async def _serve_metrics(self, request: web.Request, *, only: frozenset[str] | None,
                             compress: bool) -> web.StreamResponse:
        if not self.authorized(request):
            return _unauthorized()
        state = self.simulation.state
        if state.metrics_hang:
            await self._closing.wait()
            return web.Response(status=503)
        if state.metrics_delay > 0:
            await asyncio.sleep(state.metrics_delay)
        self.scrapes += 1
        body = self.render(only)
        if state.malformed and body:
            body = malform(body)
        data, headers = body.encode(), {"Content-Type": CONTENT_TYPE}
        if compress and "gzip" in request.headers.get("Accept-Encoding", ""):
            data, headers["Content-Encoding"] = gzip.compress(data, 6), "gzip"
        return web.Response(body=data, headers=headers)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def _version(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"version": DEFAULT_VERSIONS[self.config.names]})

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            return _unauthorized()
        name = self.config.model_name
        return web.json_response({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(self.simulation.engine.created),
            "owned_by": "vllm", "root": name, "parent": None,
            "max_model_len": self.config.engine.model_len,
        }]})


def _unauthorized() -> web.Response:
    return web.json_response({"error": "Unauthorized"}, status=401,
                             headers={"WWW-Authenticate": "Bearer"})


class SimFleet:
    """Several simulated servers in this process, each on its own port."""

    def __init__(self, configs: Iterable[SimConfig]) -> None:
        self.servers = [SimServer(c) for c in configs]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    async def start(self, listeners: Sequence[socket.socket] = (),
                    kv_listeners: Sequence[tuple[socket.socket, socket.socket]] = ()) -> None:
        """Start every server, on ``listeners`` (one each, bound and listening) if given,
        and its KV events on ``kv_listeners`` (publisher, replay) likewise."""
        started = []
        sockets: Sequence[socket.socket | None] = listeners or [None] * len(self.servers)
        kv: Sequence[tuple[socket.socket, socket.socket] | None] = (
            kv_listeners or [None] * len(self.servers))
        try:
            for server, listener, kv_pair in zip(self.servers, sockets, kv, strict=True):
                await server.start(listener, kv_pair)
                started.append(server)
        except BaseException:
            await asyncio.gather(*(s.stop() for s in started))
            raise

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers))

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
