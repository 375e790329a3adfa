"""The demo tells its story: run each demo server in simulated time, scrape its /metrics
every second through the real tracker and detector, and check that only "leaky" is
flagged, within two minutes. And the fleet itself: its ports given at once, served once
asked, and gone when the block ends, whether or not anyone asked."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from kvtop.sim.demo import NAMES, STOP_TIMEOUT_S, demo_configs, demo_fleet
from kvtop.sim.exposition import render
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
    with demo_fleet() as targets:
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
