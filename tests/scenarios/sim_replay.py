"""Recordings from kvtop's simulator in simulated time, judged as `kvtop check` judges them.

Each scrape is the `/metrics` text the simulator serves, read through the same
`TargetTracker` (adapter, rates, leak detector, stall verdict) as every command; the ground
truth comes from the simulator itself, never from `/metrics`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.worst import CheckRun
from kvtop.sim.engine import EngineConfig, RequestSpec
from kvtop.sim.exposition import render
from kvtop.sim.faults import Fault
from kvtop.sim.simulation import Simulation, Truth
from kvtop.sim.workloads import SyntheticSpec, synthetic

T0 = 1_767_225_600.0  # simulated second 0 as unix time
MIN = 60.0
TARGET = Target.from_spec("http://sim.invalid/metrics")


@dataclass
class Point:
    stats: EngineStats
    truth: Truth


@dataclass
class Replay:
    points: list[Point] = field(default_factory=list)
    check: dict[str, Any] = field(default_factory=dict)  # `kvtop check --json` at the end


def ramp(spec: SyntheticSpec, start: float, end: float, over_s: float,
         seed: int) -> Iterator[RequestSpec]:
    """Synthetic arrivals whose rate moves from `start` to `end` req/s over `over_s`."""
    top, keep = max(start, end), random.Random(seed + 7)
    for request in synthetic(SyntheticSpec(**{**spec.__dict__, "rate": top}), seed=seed):
        rate = start + (end - start) * min(request.arrival / over_s, 1.0)
        if keep.random() < rate / top:
            yield request


def replay(config: EngineConfig, requests: Iterable[RequestSpec], faults: Iterable[Fault] = (),
           *, seconds: float, interval: float = 10.0, warmup_s: float = 300.0,
           until: Callable[[Point], bool] | None = None, seed: int = 0) -> Replay:
    """Run the simulator; after `warmup_s` (monitoring joins a running server) scrape it every
    `interval` s for `seconds` s, or until `until(point)` holds."""
    sim = Simulation(config, requests, faults, seed=seed)
    sim.advance_to(warmup_s)
    run, out, t = CheckRun(), Replay(), warmup_s
    while t < warmup_s + seconds:
        t += interval
        sim.advance_to(t)
        run.feed(read_scrape(Scrape(TARGET, T0 + t, body=render(sim.engine, model_name="m"),
                        version="0.33.0")))
        (stats,) = run.trackers[TARGET.url].state.engines
        out.points.append(Point(stats, sim.truth()))
        if until is not None and until(out.points[-1]):
            break
    out.check = run.to_json()
    return out
