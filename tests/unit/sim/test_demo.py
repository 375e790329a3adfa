"""The demo tells its story: run each demo server in simulated time, scrape its /metrics
every second through the real tracker and detector, and check that only "leaky" is
flagged, within two minutes, and that only its KV events give exact leak evidence, within
three. And the fleet itself: its ports and KV event endpoints given at once, served once
asked (a subscriber that came first included), and gone when the block ends, whether or not
anyone asked."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time

import httpx
import msgspec
import pytest

from kvtop.collect.kv_events import KvEventBatch, decode_batch
from kvtop.collect.kv_feed import KvEventsFeed
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.kv_anatomy import KvAnatomy
from kvtop.derive.tracker import TargetTracker
from kvtop.sim.demo import NAMES, STOP_TIMEOUT_S, demo_configs, demo_fleet
from kvtop.sim.engine import EngineConfig
from kvtop.sim.exposition import render
from kvtop.sim.faults import Fault
from kvtop.sim.kv_publisher import _event
from kvtop.sim.server import SimConfig
from kvtop.sim.simulation import Simulation
from kvtop.sim.workloads import make_workload

T0 = 1_800_000_000.0


def states_over(name: str, seconds: int) -> list[str]:
    config = dict(demo_configs())[name]
    requests = make_workload(config.workload, seed=config.seed,
                             block_size=config.engine.block_size, **config.workload_params)
    simulation = Simulation(config.engine, requests, config.faults, seed=config.seed,
                            wall_clock=lambda: T0)
    target = Target.from_spec("127.0.0.1:1", name=name)
    tracker = TargetTracker(target)
    states = []
    for second in range(seconds):
        simulation.advance_to(float(second))
        body = render(simulation.engine, model_name=config.model_name)
        (engine,) = tracker.update(read_scrape(Scrape(target, T0 + second, body=body))).engines
        states.append(engine.leak.state)
    return states


def kv_evidence_over(name: str, seconds: int) -> list[tuple[str, int | None]]:
    """(exact leak evidence state, leaked blocks) each 30 s, from the demo server's KV
    events as its publisher encodes them (a restart a new sequence, as the subscriber
    tells it)."""
    config = dict(demo_configs())[name]
    engine = dataclasses.replace(config.engine, kv_events=True)
    requests = make_workload(config.workload, seed=config.seed, block_size=engine.block_size,
                             **config.workload_params)
    simulation = Simulation(engine, requests, config.faults, seed=config.seed,
                            wall_clock=lambda: T0)
    anatomy, encoder, seq, seen = KvAnatomy(), msgspec.msgpack.Encoder(), 0, simulation.engine
    found, restart = [], False
    for second in range(seconds):
        simulation.advance_to(float(second))
        restart |= simulation.engine is not seen  # told with the new engine's first batch
        seen = simulation.engine
        while simulation.engine.kv_batches:
            clock, events = simulation.engine.kv_batches.popleft()
            decoded = decode_batch(encoder.encode(
                [clock, [_event(e, engine.block_size) for e in events], 0]))
            anatomy.fold(KvEventBatch(t=T0 + second, rank=0, seq=seq, ts=decoded.ts,
                                      events=tuple(decoded.events), restart=restart))
            seq, restart = seq + 1, False
        if second % 30 == 29:
            stats = anatomy.stats(T0 + second, engine.num_gpu_blocks - 1)
            found.append((stats.leak, stats.leaked_blocks))
    return found


def test_the_demo_servers_are_the_four_its_story_tells_of() -> None:
    """A pool of 2000 blocks, residency histograms and KV events on an ephemeral port each;
    the leak of one in twenty requests from 30 s, restarts at 90 s and 210 s."""
    engine = EngineConfig(num_gpu_blocks=2000, max_num_seqs=64, kv_cache_metrics=True)
    assert demo_configs() == [
        ("mooncake", SimConfig(model_name="llama-3-8b", engine=engine, workload="mooncake",
                               workload_params={"rate_scale": 0.5}, seed=1, kv_events_port=0)),
        ("prefix-heavy", SimConfig(
            model_name="qwen2.5-7b", engine=engine, seed=2, kv_events_port=0,
            workload_params={"rate": 5.0, "groups": 2, "system_prompt_len": 2048,
                             "shared_frac": 0.95})),
        ("leaky", SimConfig(
            model_name="llama-3-8b", engine=engine, seed=3, kv_events_port=0,
            workload_params={"rate": 1.0, "arrival": "bursty", "burst_factor": 8.0,
                             "burst_len": 5.0},
            faults=[Fault(30.0, "leak", 0.05)])),
        ("restarts", SimConfig(model_name="mistral-7b", engine=engine, seed=4, kv_events_port=0,
                               workload_params={"rate": 3.0},
                               faults=[Fault(90.0, "restart"), Fault(210.0, "restart")]))]


def test_only_the_leaky_demo_server_shows_exact_leak_evidence_within_three_minutes() -> None:
    """The second witness tells the demo's story too: the leaky server's blocks outlive
    three turnovers of its pool by t=180 s; every other server's are all used."""
    leaky = kv_evidence_over("leaky", 180)
    assert leaky[-1][0] == "evidence" and (leaky[-1][1] or 0) > 0
    assert all(state == "too_early" for state, _ in leaky[:3])  # the leak began at 30 s
    for name in ("mooncake", "prefix-heavy", "restarts"):
        assert {state for state, _ in kv_evidence_over(name, 240)} <= {"too_early", "none"}


def test_leaky_goes_ok_watch_leak_within_two_minutes() -> None:
    states = states_over("leaky", 120)
    assert "ok" in states[:30]
    assert states[-1] == "leak"
    assert states.index("watch") < states.index("leak")


@pytest.mark.parametrize("name", ["mooncake", "prefix-heavy", "restarts"])
def test_healthy_demo_servers_never_leak(name: str) -> None:
    states = states_over(name, 240)
    assert "leak" not in states and "watch" not in states


def _fleet_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "kvtop-demo-fleet"]


def test_the_fleet_answers_once_asked_and_stops_with_the_block() -> None:
    with demo_fleet() as (targets, _):
        assert [t.label for t in targets] == list(NAMES)
        # the first request waits in the listen queue while the simulator starts
        answers = [httpx.get(t.url, timeout=30) for t in targets]
        assert [a.status_code for a in answers] == [200] * len(NAMES)
        assert all('model_name="' in a.text for a in answers)
    assert _fleet_threads() == []
    with pytest.raises(httpx.ConnectError):  # the ports are closed with it
        httpx.get(targets[0].url, timeout=5)


def test_a_fleet_nobody_asked_ends_with_its_block() -> None:
    with demo_fleet():
        assert len(_fleet_threads()) == 1  # waiting for a first connection
        started = time.monotonic()
    # woken, not left to the join's timeout (which would hold every demo's exit)
    assert time.monotonic() - started < STOP_TIMEOUT_S
    assert _fleet_threads() == []


async def _first_batches(targets: list[Target], feed: KvEventsFeed) -> dict[str, int]:
    """Subscribe first, then ask each server (the simulator starts on the first request):
    stored blocks per target once every one has published some."""
    stored: dict[str, int] = {}

    def count(item: object) -> None:
        batch = item.batch  # type: ignore[attr-defined]
        stored[item.target.url] = stored.get(item.target.url, 0) + sum(  # type: ignore[attr-defined]
            len(e.hashes) for e in batch.events if type(e).__name__ == "BlockStored")

    stop = asyncio.Event()
    task = asyncio.create_task(feed.run(count, stop=stop))
    async with httpx.AsyncClient() as client:
        for target in targets:
            await client.get(target.url, timeout=30)
    deadline = time.monotonic() + 60
    while len([n for n in stored.values() if n]) < len(targets):
        assert time.monotonic() < deadline, f"KV events from {sorted(stored)} only"
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 10)
    return stored


def test_every_demo_server_publishes_on_the_endpoint_named_before_it_ran() -> None:
    with demo_fleet() as fleet:
        assert sorted(fleet.kv_events) == sorted(t.url for t in fleet.targets)
        feed = KvEventsFeed(fleet.targets, fleet.kv_events)
        stored = asyncio.run(_first_batches(fleet.targets, feed))
        assert all(stored[t.url] > 0 for t in fleet.targets)
        assert {c.error for c in feed.channels.values()} == {None}
        endpoint = next(iter(fleet.kv_events.values()))
    port = int(endpoint.url.rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError):  # its sockets are closed with it
        socket.create_connection(("127.0.0.1", port), timeout=5)
