"""Two simulated vLLM servers and three GPU exporters serving real bodies
(tests/fixtures/gpu), in their own process for a Prometheus to scrape:
``python -m tests.prometheus.gpu_fleet`` prints one JSON line of ``name: /metrics URL`` and
serves until stdin closes."""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web

from kvtop.sim.server import SimConfig, SimFleet
from tests.scenarios.gpu import DCGM_POD, DCGM_T4, NVIDIA_SMI_H100, gpu_fixture

EXPORTERS = {"dcgm": DCGM_T4, "dcgm_pod": DCGM_POD, "nvidia_smi": NVIDIA_SMI_H100}


async def _exporter(body: str) -> tuple[web.AppRunner, str]:
    """An exporter's /metrics on an ephemeral port: the body, as the exporter sends it."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/metrics"


async def serve() -> None:
    runners = []
    urls = {}
    try:
        for name, fixture in EXPORTERS.items():
            runner, urls[name] = await _exporter(gpu_fixture(fixture))
            runners.append(runner)
        async with SimFleet([SimConfig(seed=1), SimConfig(seed=2)]) as fleet:
            urls["vllm_pod"], urls["vllm"] = (f"{url}/metrics" for url in fleet.urls)
            print(json.dumps(urls), flush=True)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, sys.stdin.read)  # until the test closes stdin
    finally:
        for runner in runners:
            await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(serve())
