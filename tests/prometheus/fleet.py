"""Simulated vLLM servers for the Prometheus tier, in their own process (Prometheus scrapes
them while the tests run kvtop), and an idle vLLM 0.8 without ``/version`` (its version can
only be inferred): ``python -m tests.prometheus.fleet`` prints one JSON line
``{"leaky": url, "healthy": [url, url], "paused": url, "old": url}`` and serves until stdin
closes."""

from __future__ import annotations

import asyncio
import json
import sys

from kvtop.sim.engine import EngineConfig
from kvtop.sim.faults import plan
from kvtop.sim.server import SimConfig, SimFleet
from tests.fakes.faultserver import FaultServer
from tests.scenarios.derived import vllm_08_idle

# Bursts with idle gaps (~20 s): a leak shows as blocks held while nothing runs.
BURSTS = {"rate": 0.4, "arrival": "bursty", "burst_factor": 8.0, "burst_len": 4.0,
          "output_mean": 60.0}
ENGINE = EngineConfig(num_gpu_blocks=800, max_num_seqs=32)
PAUSED_AT = 20.0  # simulated seconds: mid-load, then frozen (same values every scrape)


def configs() -> list[SimConfig]:
    return [
        SimConfig(engine=ENGINE, workload_params=BURSTS, seed=5,
                  faults=plan(leak_frac=0.3, leak_at=0.0)),
        SimConfig(engine=ENGINE, workload_params=BURSTS, seed=6),
        SimConfig(engine=ENGINE, workload_params=BURSTS, seed=7),
        SimConfig(seed=0, autostep=False),
    ]


async def serve() -> None:
    old = FaultServer(bodies=[vllm_08_idle().encode()], version=None)
    async with SimFleet(configs()) as fleet, old:
        paused = fleet.servers[3]
        paused.simulation.advance_to(PAUSED_AT)
        urls = [f"{url}/metrics" for url in fleet.urls]
        print(json.dumps({"leaky": urls[0], "healthy": urls[1:3], "paused": urls[3],
                          "old": old.url()}), flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)  # until the test closes stdin


if __name__ == "__main__":
    asyncio.run(serve())
