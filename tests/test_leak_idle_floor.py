"""The first idle after a leak has begun, and where the idle floor comes from.

`kvtop --demo`'s "leaky" server, replayed in simulated time through the tracker: once it has
leaked, an idle pool holding blocks must never read "pool drained to its idle floor", and the
reason must follow the blocks the pool holds now, not those of an earlier idle. The floor
itself comes from the server's version, never from an idle period; a version kvtop only
inferred from metric names is not exact, and the floor it implies is the larger one, said so.
"""

from __future__ import annotations

import re

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.reading import EngineReading
from kvtop.collect.target import Scrape, Target
from kvtop.derive.leak import LeakDetector
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetTracker
from kvtop.sim.demo import LEAK_AT_S, demo_configs
from kvtop.sim.exposition import render
from kvtop.sim.simulation import Simulation, Truth
from kvtop.sim.workloads import make_workload
from tests.paths import fixture_text

T0 = 1_767_225_600.0
TARGET = Target.from_spec("http://127.0.0.1:8000", name="leaky")
HELD = re.compile(r"^(\d+) blocks held")
Replay = list[tuple[EngineStats, Truth]]


def replay_demo_leaky(seconds: int) -> Replay:
    """The demo's leaky server scraped every second, as the app does."""
    config = dict(demo_configs())["leaky"]
    requests = make_workload(config.workload, seed=config.seed, **config.workload_params)
    sim = Simulation(config.engine, requests, config.faults, seed=config.seed)
    tracker, out = TargetTracker(TARGET), []
    for second in range(1, seconds + 1):
        sim.advance_to(float(second))
        body = render(sim.engine, model_name=config.model_name)
        (stats,) = tracker.update(Scrape(TARGET, T0 + second, body=body,
                                         version="0.33.0")).engines
        out.append((stats, sim.truth()))
    return out


@pytest.fixture(scope="module")
def leaky() -> Replay:
    return replay_demo_leaky(200)


def test_an_idle_pool_holding_blocks_never_reads_drained(leaky: Replay) -> None:
    held_idle = [(s, t) for s, t in leaky if t.running == 0 and t.used_blocks > 2]
    assert held_idle, "the demo never went idle holding blocks"
    assert all(t.sim_time > LEAK_AT_S for _, t in held_idle)
    for stats, truth in held_idle:
        assert stats.leak is not None
        assert "drained" not in stats.leak.reason, (truth.sim_time, stats.leak.reason)
    drained = [s for s, t in leaky if "drained to its idle floor:" in s.leak.reason]
    assert drained and all(s.blocks_used == 0 for s in drained)


def test_the_reason_follows_the_blocks_held_now(leaky: Replay) -> None:
    idle = [(s, t) for s, t in leaky if t.running == 0 and t.waiting == 0 and t.used_blocks > 2]
    sizes = {t.used_blocks for _, t in idle}
    assert len(sizes) >= 3, f"want several idle periods holding more each time: {sizes}"
    for stats, truth in idle:
        match = HELD.match(stats.leak.reason)
        assert match, stats.leak.reason
        assert int(match.group(1)) == truth.used_blocks, (truth.sim_time, stats.leak.reason)


def test_leak_figures_only_once_confirmed_and_never_above_the_truth(leaky: Replay) -> None:
    states = [s.leak.state for s, _ in leaky]
    assert "watch" in states and states[-1] == "leak"
    assert states.index("watch") < states.index("leak")
    for stats, truth in leaky:
        verdict = stats.leak
        if verdict.state in ("ok", "warmup"):
            assert (verdict.leaked_blocks, verdict.slope_blocks_per_hour,
                    verdict.hours_to_full) == (None, None, None)
        elif verdict.leaked_blocks is not None and truth.running == 0:
            assert verdict.leaked_blocks <= truth.leaked_blocks + 1


def test_the_floor_is_never_learned_from_an_idle_pool() -> None:
    # Monitoring starts after the leak: the very first scrapes are an idle pool holding 40
    # blocks. With vLLM 0.33's floor of 0 those are leaked blocks, not a floor.
    base = dict(model="m", engine="0", blocks_total=1000, running=0.0, waiting=0.0)
    detector = LeakDetector()
    verdicts = [detector.update(EngineStats(t=T0 + i, blocks_used=40.0, **base))
                for i in range(90)]
    assert verdicts[-1].state == "leak" and verdicts[-1].leaked_blocks == 40.0
    assert all("drained" not in v.reason for v in verdicts)
    assert "40 blocks held with nothing running" in verdicts[5].reason


def _reading(version: str | None) -> EngineReading:
    (engine,) = read_exposition(fixture_text("vllm-0.10.1.1-v1-twin-leaking-idle.txt"),
                                version=version).engines
    return engine


def test_an_inferred_version_is_not_exact_and_takes_the_larger_floor() -> None:
    # The 0.10.1.1 twin, leaking, idle: usage counts the null block (1/N) on top.
    assert (_reading("0.10.1.1").idle_floor_blocks, _reading("0.10.1.1").idle_floor_exact) == (
        1, True)
    for unknown in (None, "0.7+", "0.9.2+"):  # no /version, or an era label kvtop inferred
        engine = _reading(unknown)
        assert (engine.idle_floor_blocks, engine.idle_floor_exact) == (1, False), unknown


def test_an_assumed_floor_is_said_so_in_the_reason() -> None:
    body = fixture_text("vllm-0.10.1.1-v1-twin-leaking-idle.txt")
    for version, assumed in ((None, True), ("0.7+", True), ("0.10.1.1", False)):
        tracker = TargetTracker(TARGET)
        for i in range(40):
            state = tracker.update(Scrape(TARGET, T0 + i, body=body, version=version))
        (stats,) = state.engines
        assert stats.leak is not None and stats.leak.state in ("watch", "leak")
        assert ("assumed" in stats.leak.reason) is assumed, (version, stats.leak.reason)
        # usage × 600 counts the null block; the residual leaves it out
        assert stats.leak.leaked_blocks == pytest.approx(stats.blocks_used - 1)
