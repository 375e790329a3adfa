"""Clock, arrivals and scheduled faults of one simulated server, without HTTP.

The simulator's lump and wedge faults: a lump leaks whole requests at once until its size,
then stops; a wedge takes every free block and stops the engine while requests still arrive."""

from __future__ import annotations

import itertools

import pytest

from kvtop.sim.engine import EngineConfig, RequestSpec
from kvtop.sim.faults import Fault, FaultSchedule, FaultState, plan
from kvtop.sim.simulation import Simulation
from kvtop.sim.workloads import SyntheticSpec, synthetic
from tests.scenarios.sim_invariants import check_pool_invariants


def steady(rate: float = 5.0, seed: int = 0) -> object:
    return synthetic(SyntheticSpec(rate=rate, prompt_mean=200, output_mean=50), seed=seed)


def unique_bursts(times: list[float], n: int = 20) -> list[RequestSpec]:
    return [RequestSpec(t, 300, 40) for t in times for _ in range(n)]


def test_clock_follows_events_and_idles_to_the_target() -> None:
    sim = Simulation(EngineConfig(), [RequestSpec(5.0, 100, 10)])
    assert sim.advance_to(4.0)
    assert sim.clock == 4.0 and sim.truth().waiting == 0
    sim.advance_to(10.0)
    truth = sim.truth()
    assert truth.finished["length"] == 1 and truth.running == 0
    assert sim.clock == 10.0


def test_max_steps_bounds_the_work_per_call() -> None:
    sim = Simulation(EngineConfig(), steady())
    assert not sim.advance_to(30.0, max_steps=10)
    assert sim.truth().steps == 10


def test_leak_starts_at_its_time_and_idle_usage_equals_leaked_blocks() -> None:
    sim = Simulation(EngineConfig(num_gpu_blocks=3000), unique_bursts([1.0, 21.0]),
                     plan(leak_frac=0.5, leak_at=20.0))
    sim.advance_to(19.0)
    before = sim.truth()
    assert before.finished["length"] == 20 and before.kv_usage == 0.0
    assert before.leaked_blocks == 0
    sim.advance_to(60.0)
    after = sim.truth()
    assert after.running == after.waiting == 0
    assert after.leaked_requests > 0
    assert after.used_blocks == after.leaked_blocks > 0
    assert after.kv_usage == pytest.approx(after.leaked_blocks / 2999, rel=1e-12)
    check_pool_invariants(sim.engine)


def test_stall_freezes_counters_while_waiting_grows_then_resumes() -> None:
    sim = Simulation(EngineConfig(), steady(), [Fault(10.0, "stall", 20.0)])
    sim.advance_to(10.0)
    frozen = sim.truth()
    assert frozen.stalled
    sim.advance_to(25.0)
    later = sim.truth()
    assert later.generation_tokens == frozen.generation_tokens
    assert later.steps == frozen.steps
    assert later.waiting > frozen.waiting + 30
    sim.advance_to(40.0)
    resumed = sim.truth()
    assert not resumed.stalled
    assert resumed.generation_tokens > later.generation_tokens


def test_restart_resets_state_and_counters() -> None:
    clock = itertools.count(1000.0, 10.0)
    sim = Simulation(EngineConfig(), steady(), [Fault(20.0, "restart")],
                     wall_clock=lambda: next(clock))
    sim.advance_to(19.9)
    before = sim.truth()
    assert before.generation_tokens > 0 and before.restarts == 0
    sim.advance_to(20.0)
    after = sim.truth()
    assert after.restarts == 1
    assert after.created > before.created
    assert after.generation_tokens == after.prompt_tokens == 0
    assert after.used_blocks == 0 and after.running == 0
    sim.advance_to(30.0)
    assert sim.truth().generation_tokens > 0  # arrivals keep coming after the restart


def test_client_aborts_are_counted() -> None:
    spec = SyntheticSpec(rate=20, prompt_mean=200, output_mean=400, abort_frac=1.0,
                         abort_after=0.2, eos_frac=0.0)
    sim = Simulation(EngineConfig(), synthetic(spec))
    sim.advance_to(5.0)
    truth = sim.truth()
    assert truth.finished["abort"] > 50
    assert truth.finished["length"] == truth.finished["stop"] == 0


def test_fault_schedule_and_state() -> None:
    schedule = FaultSchedule([Fault(5, "hang"), Fault(1, "slow", 0.5), Fault(5, "heal")])
    assert schedule.next_time() == 1
    assert [f.kind for f in schedule.pop_due(5)] == ["slow", "hang", "heal"]
    state = FaultState()
    for fault in (Fault(0, "slow", 0.5), Fault(0, "malformed"), Fault(0, "auth", "t")):
        state.apply(fault)
    assert (state.metrics_delay, state.malformed, state.token) == (0.5, True, "t")
    state.apply(Fault(0, "heal"))
    assert (state.metrics_delay, state.malformed, state.metrics_hang) == (0.0, False, False)


def test_inject_applies_now() -> None:
    sim = Simulation(EngineConfig(), [])
    sim.inject("leak", 0.25)
    assert sim.engine.leak_frac == 0.25 and sim.truth().leak_frac == 0.25
    sim.inject("restart")
    assert sim.engine.leak_frac == 0.25  # a restart does not fix the bug


def waves(times: list[float], n: int = 20) -> list[RequestSpec]:
    """Unique prompts of 300 tokens and 40 out (22 blocks each), `n` at each time."""
    return [RequestSpec(t, 300, 40) for t in times for _ in range(n)]


def test_a_lump_leaks_whole_requests_up_to_its_size_then_stops() -> None:
    sim = Simulation(EngineConfig(num_gpu_blocks=3000), waves([1.0, 31.0, 61.0]),
                     [Fault(30.0, "lump", 50.0)])
    sim.advance_to(29.0)
    assert sim.truth().leaked_blocks == 0  # nothing before the lump
    sim.advance_to(60.0)
    lump = sim.truth()
    assert lump.running == lump.waiting == 0
    # whole requests of 22 blocks: the fewest that reach 50 are 3 of them
    assert lump.leaked_requests == 3 and lump.leaked_blocks == 66 == lump.used_blocks
    sim.advance_to(90.0)
    after = sim.truth()
    assert after.leaked_blocks == lump.leaked_blocks  # the lump is spent: no more leaks
    assert after.finished["length"] == 60
    check_pool_invariants(sim.engine)


def test_a_wedge_fills_the_pool_and_stops_progress_while_the_queue_grows() -> None:
    requests = synthetic(SyntheticSpec(rate=5.0, prompt_mean=200, output_mean=50), seed=1)
    sim = Simulation(EngineConfig(num_gpu_blocks=2000), requests, plan(wedge_at=20.0))
    sim.advance_to(20.0)
    wedged = sim.truth()
    assert wedged.stalled and wedged.kv_usage == 1.0 and wedged.free_blocks == 0
    assert wedged.leaked_requests == 0  # the taken blocks belong to no request
    sim.advance_to(40.0)
    later = sim.truth()
    assert later.generation_tokens == wedged.generation_tokens and later.steps == wedged.steps
    assert later.waiting > wedged.waiting + 50 and later.kv_usage == 1.0
