"""``kvtop --demo``: a small simulated fleet that tells a story in two minutes.

* ``mooncake``: healthy, replaying the real Mooncake trace (shipped in kvtop/sim/traces);
* ``prefix-heavy``: healthy, nearly every request shares a long system prompt;
* ``leaky``: bursts with ~30 s idle gaps; from t=30 s one in twenty finished requests never
  frees its blocks, so the idle floor ratchets up and the leak indicator goes OK → WATCH
  (~70 s) → LEAK (~110 s) with the default detector settings;
* ``restarts``: healthy, restarted at t=90 s and t=210 s (counters reset, no negative rates).

Every server exports the block residency histograms (``--kv-cache-metrics``) and publishes
its KV events as vLLM's zmq publisher does, so the cache pane has something to show: each
target's endpoint is in :attr:`DemoFleet.kv_events`.

The fleet runs on its own event loop in a background thread, so its stepping never
competes with the terminal app's loop for scheduling. Its ports are bound at once, but the
simulator (and aiohttp's server, a fifth of a second to import) starts only when the first
connection waits on one of them: after the app's first frame, which so never waits for it.
A connection made meanwhile waits in the listen queue; none is refused.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

from kvtop.collect.kv_endpoint import KvEventsEndpoint
from kvtop.collect.target import Target

if TYPE_CHECKING:
    from kvtop.sim.server import SimConfig

HOST = "127.0.0.1"  # never reachable from outside the machine
NAMES = ("mooncake", "prefix-heavy", "leaky", "restarts")
LEAK_AT_S = 30.0
STOP_TIMEOUT_S = 15.0


def demo_configs() -> list[tuple[str, SimConfig]]:
    """(display name, simulator config) of each demo server."""
    from kvtop.sim.engine import EngineConfig
    from kvtop.sim.faults import plan
    from kvtop.sim.server import SimConfig

    engine = EngineConfig(num_gpu_blocks=2000, max_num_seqs=64, kv_cache_metrics=True)
    events_port = 0  # KV events on: the demo passes the sockets it listens on
    healthy = SimConfig(model_name="llama-3-8b", engine=engine, workload="mooncake",
                        workload_params={"rate_scale": 0.5}, seed=1, kv_events_port=events_port)
    prefix_heavy = SimConfig(
        model_name="qwen2.5-7b", engine=engine, seed=2,
        workload_params={"rate": 5.0, "groups": 2, "system_prompt_len": 2048,
                         "shared_frac": 0.95}, kv_events_port=events_port)
    leaky = SimConfig(
        model_name="llama-3-8b", engine=engine, seed=3,
        workload_params={"rate": 1.0, "arrival": "bursty", "burst_factor": 8.0,
                         "burst_len": 5.0},
        faults=plan(leak_frac=0.05, leak_at=LEAK_AT_S), kv_events_port=events_port)
    restarts = SimConfig(model_name="mistral-7b", engine=engine, seed=4,
                         workload_params={"rate": 3.0},
                         faults=plan(restart_at=[90.0, 210.0]), kv_events_port=events_port)
    return list(zip(NAMES, (healthy, prefix_heavy, leaky, restarts), strict=True))


class DemoFleet(NamedTuple):
    targets: list[Target]
    kv_events: dict[str, KvEventsEndpoint]  # by target URL


async def _serve(listeners: list[socket.socket], kv_listeners: list[KvListeners],
                 stop: asyncio.Event) -> None:
    from kvtop.sim.server import SimFleet

    fleet = SimFleet([config for _, config in demo_configs()])
    await fleet.start(listeners, kv_listeners)
    try:
        await stop.wait()
    finally:
        await fleet.stop()


KvListeners = tuple[socket.socket, socket.socket]  # a server's KV publisher and replay socket


def _url(listener: socket.socket, scheme: str) -> str:
    return f"{scheme}://{HOST}:{listener.getsockname()[1]}"


@contextmanager
def demo_fleet() -> Iterator[DemoFleet]:
    """Serve the demo fleet on 127.0.0.1 while the block runs; yields its targets and their
    KV event endpoints at once (every socket is listening before the block starts, so a
    subscriber may connect before the simulator runs). Raises RuntimeError after the block
    when the simulator failed (a bug)."""
    listeners = [socket.create_server((HOST, 0), backlog=128) for _ in NAMES]
    kv_listeners = [(socket.create_server((HOST, 0)), socket.create_server((HOST, 0)))
                    for _ in NAMES]
    wake, woken = socket.socketpair()  # closing wake ends the wait for a first connection
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failure: list[BaseException] = []

    def serve() -> None:
        readable, _, _ = select.select([*listeners, woken], [], [])
        if woken in readable:  # the block ended before anyone connected
            return
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(_serve(listeners, kv_listeners, stop))
        except BaseException as exc:  # reported to the caller when the block ends
            failure.append(exc)

    targets = [Target.from_spec(_url(listener, "http"), name=name)
               for name, listener in zip(NAMES, listeners, strict=True)]
    fleet = DemoFleet(targets, {
        target.url: KvEventsEndpoint(_url(pub, "tcp"), _url(replay, "tcp"))
        for target, (pub, replay) in zip(targets, kv_listeners, strict=True)})
    thread = threading.Thread(target=serve, name="kvtop-demo-fleet", daemon=True)
    thread.start()
    try:
        yield fleet
    finally:
        loop.call_soon_threadsafe(stop.set)
        wake.close()
        # let the servers close before the interpreter exits (a busy machine can be slow)
        thread.join(timeout=STOP_TIMEOUT_S)
        for sock in (*listeners, *(s for pair in kv_listeners for s in pair), woken):
            sock.close()  # one ZeroMQ took over is detached: closing it does nothing
        if not thread.is_alive():
            loop.close()
    if failure:
        raise RuntimeError(f"the demo fleet failed: {failure[0]!r}") from failure[0]
