"""The demo tells its story: run each demo server in simulated time, scrape its /metrics
every second through the real tracker and detector, and check that only "leaky" is
flagged, within two minutes."""

from __future__ import annotations

import pytest

from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from kvtop.sim.demo import demo_configs
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
