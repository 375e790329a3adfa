"""Runs of one simulated server for judging ``kvtop compare``, made without HTTP in
simulated time (as benchmarks/leak_eval does): every ``interval_s`` simulated seconds the
server's ``/metrics`` text, exactly as ``kvtop sim`` serves it, becomes one scrape.

The healthy server is a pool of 1000 blocks under a steady synthetic load; each change
(a leak, a smaller pool, prefix caching off on a prefix-heavy workload, double the arrival
rate, another seed) is one field of :class:`RunSpec`. Steps are costed like a larger model
(25 ms each) so an hour of server time takes seconds of CPU.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvtop.baseline.collect import Collector
from kvtop.baseline.model import Baseline
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.sim.engine import EngineConfig, StepCost
from kvtop.sim.exposition import Names, render
from kvtop.sim.simulation import Simulation
from kvtop.sim.workloads import RequestSpec, make_workload
from kvtop.store.recording import RecordingWriter

EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: simulated second 0 as unix time
MODEL = "sim-llama-3-8b"
WARMUP_S = 120.0  # simulated before the run starts: a baseline is taken of a busy server
COST = StepCost(base_ms=50.0, prefill_token_ms=0.08, decode_seq_ms=0.5)
PREFIX_HEAVY = {"groups": 2, "system_prompt_len": 1536, "shared_frac": 0.95}


@dataclass(frozen=True)
class RunSpec:
    seed: int = 0
    blocks: int = 600
    rate: float = 1.0  # requests per simulated second, on average
    arrival: str = "poisson"  # or "bursty": bursts with idle gaps between them
    prefix_heavy: bool = False
    prefix_caching: bool = True
    leak_frac: float = 0.0  # from the start of the run (after the warm-up)
    ramp_to: float | None = None  # the rate at the end of the run, risen evenly from `rate`
    minutes: float = 20.0
    interval_s: float = 10.0
    names: Names = "v1"
    url: str = "sim://server"

    def but(self, **changes: object) -> RunSpec:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


HEALTHY = RunSpec()
CHANGES: dict[str, RunSpec] = {
    "leak": HEALTHY.but(leak_frac=0.01),
    "fewer_blocks": HEALTHY.but(blocks=420),
    "prefix_caching_off": HEALTHY.but(prefix_heavy=True, prefix_caching=False),
    "double_rate": HEALTHY.but(rate=2.0),
}


def simulation(spec: RunSpec) -> Simulation:
    config = EngineConfig(num_gpu_blocks=spec.blocks, enable_prefix_caching=spec.prefix_caching,
                          cost=COST)
    params: dict[str, object] = {"rate": spec.rate, "output_mean": 100.0,
                                 "arrival": spec.arrival}
    if spec.prefix_heavy:
        params.update(PREFIX_HEAVY)
    workload = make_workload("synthetic", seed=spec.seed, **params)
    if spec.ramp_to is not None and spec.ramp_to > spec.rate:
        workload = _ramped(workload, spec, params)
    sim = Simulation(config, workload, seed=spec.seed, wall_clock=lambda: EPOCH)
    sim.advance_to(WARMUP_S)
    if spec.leak_frac:
        sim.inject("leak", spec.leak_frac)
    return sim


def _ramped(steady: Iterator[RequestSpec], spec: RunSpec,
            params: dict[str, object]) -> Iterator[RequestSpec]:
    """The steady load plus arrivals at the extra rate kept with a probability rising from 0
    at the start of the run to 1 at its end (thinning): the rate ramps from `rate` to
    `ramp_to`."""
    assert spec.ramp_to is not None
    extra = make_workload("synthetic", seed=spec.seed + 7919,
                          **{**params, "rate": spec.ramp_to - spec.rate})
    rng = random.Random(spec.seed)
    length = spec.minutes * 60
    kept = (r for r in extra if rng.random() < min(1.0, max(0.0, (r.arrival - WARMUP_S)
                                                            / length)))
    return heapq.merge(steady, kept, key=lambda r: r.arrival)


def scrapes(spec: RunSpec) -> Iterator[Scrape]:
    """The run's scrapes, each as served at its simulated time."""
    sim, target = simulation(spec), Target(url=spec.url)
    t = WARMUP_S
    while t < WARMUP_S + spec.minutes * 60:
        t += spec.interval_s
        sim.advance_to(t)
        yield read_scrape(Scrape(target, EPOCH + t,
                     body=render(sim.engine, model_name=MODEL, names=spec.names)))


def baseline(spec: RunSpec, name: str | None = None) -> Baseline:
    """The run summarised as ``kvtop baseline save --from`` would."""
    collector = Collector()
    for scrape in scrapes(spec):
        collector.feed(scrape)
    return collector.baseline(name=name, source={"kind": "recording", "recording": None},
                              interval_s=spec.interval_s)


def write_recording(spec: RunSpec, path: Path) -> Path:
    with RecordingWriter(path, interval_s=spec.interval_s,
                         targets=[Target(url=spec.url)]) as writer:
        for scrape in scrapes(spec):
            writer.write(scrape)
    return path
