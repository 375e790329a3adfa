"""``kvtop --demo``: a small simulated fleet that tells a story in two minutes.

* ``mooncake``: healthy, replaying the real Mooncake trace (shipped in kvtop/sim/traces);
* ``prefix-heavy``: healthy, nearly every request shares a long system prompt;
* ``leaky``: bursts with ~30 s idle gaps; from t=30 s one in twenty finished requests never
  frees its blocks, so the idle floor ratchets up and the leak indicator goes OK → WATCH
  (~70 s) → LEAK (~110 s) with the default detector settings;
* ``restarts``: healthy, restarted at t=90 s and t=210 s (counters reset, no negative rates).

The fleet runs on its own event loop in a background thread, so its stepping never
competes with the terminal app's loop for scheduling.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kvtop.collect.target import Target
from kvtop.sim.engine import EngineConfig
from kvtop.sim.faults import plan
from kvtop.sim.server import SimConfig, SimFleet

LEAK_AT_S = 30.0
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0


def demo_configs() -> list[tuple[str, SimConfig]]:
    """(display name, simulator config) of each demo server."""
    engine = EngineConfig(num_gpu_blocks=2000, max_num_seqs=64)
    healthy = SimConfig(model_name="llama-3-8b", engine=engine, workload="mooncake",
                        workload_params={"rate_scale": 0.5}, seed=1)
    prefix_heavy = SimConfig(
        model_name="qwen2.5-7b", engine=engine, seed=2,
        workload_params={"rate": 5.0, "groups": 2, "system_prompt_len": 2048,
                         "shared_frac": 0.95})
    leaky = SimConfig(
        model_name="llama-3-8b", engine=engine, seed=3,
        workload_params={"rate": 1.0, "arrival": "bursty", "burst_factor": 8.0,
                         "burst_len": 5.0},
        faults=plan(leak_frac=0.05, leak_at=LEAK_AT_S))
    restarts = SimConfig(model_name="mistral-7b", engine=engine, seed=4,
                         workload_params={"rate": 3.0},
                         faults=plan(restart_at=[90.0, 210.0]))
    return [("mooncake", healthy), ("prefix-heavy", prefix_heavy), ("leaky", leaky),
            ("restarts", restarts)]


@contextmanager
def demo_fleet() -> Iterator[list[Target]]:
    """Serve the demo fleet on 127.0.0.1 while the block runs; yields its targets."""
    named = demo_configs()
    fleet = SimFleet([config for _, config in named])
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    failure: list[BaseException] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(fleet.start())
        except BaseException as exc:  # reported to the caller below
            failure.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(fleet.stop())
        loop.close()

    thread = threading.Thread(target=serve, name="kvtop-demo-fleet", daemon=True)
    thread.start()
    if not ready.wait(START_TIMEOUT_S) or failure:
        raise RuntimeError(f"the demo fleet did not start: {failure[0] if failure else 'timeout'}")
    try:
        yield [Target.from_spec(server.url, name=name)
               for (name, _), server in zip(named, fleet.servers, strict=True)]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        # let the servers close before the interpreter exits (a busy machine can be slow)
        thread.join(timeout=STOP_TIMEOUT_S)
