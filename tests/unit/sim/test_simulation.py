"""Clock, arrivals and scheduled faults of one simulated server, without HTTP.

The simulator's lump and wedge faults: a lump leaks whole requests at once until its size,
then stops; a wedge takes every free block and stops the engine while requests still arrive."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from kvtop.sim.engine import EngineConfig, RequestSpec
from kvtop.sim.faults import Fault, FaultSchedule, FaultState, plan
from kvtop.sim.simulation import Simulation, Truth
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


# --- the truth, the clock's jumps, the API's requests and restarts -------------------------------

NO_FINISH = {"stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0}


def test_truth_is_the_whole_server_before_during_and_after_a_request() -> None:
    sim = Simulation(EngineConfig(num_gpu_blocks=100),
                     [RequestSpec(0.0, 40, 3), RequestSpec(0.5, 0, 3)],
                     wall_clock=lambda: 1234.5)
    idle = Truth(sim_time=0.0, created=1234.5, restarts=0, stalled=False, leak_frac=0.0,
                 num_gpu_blocks=100, block_size=16, used_blocks=0, free_blocks=99,
                 cached_free_blocks=0, leaked_blocks=0, leaked_requests=0, kv_usage=0.0,
                 running=0, waiting=1, prefix_queries=0, prefix_hits=0, preemptions=0,
                 prompt_tokens=0, generation_tokens=0, finished=NO_FINISH, steps=0)
    assert sim.truth() == idle  # the arrival at 0 is in from the start
    assert sim.advance_to(0.001) is True
    # one step of 5 ms + 40 prompt tokens at 0.04 ms: 41 tokens in 3 blocks of 16
    assert sim.truth() == replace(
        idle, sim_time=0.0066, used_blocks=3, free_blocks=96, kv_usage=1 - 96 / 99,
        running=1, waiting=0, prefix_queries=40, prompt_tokens=40, generation_tokens=1,
        steps=1)
    sim.advance_to(1.0)
    assert sim.truth() == replace(
        idle, sim_time=1.0, cached_free_blocks=2, waiting=0, prefix_queries=40,
        prompt_tokens=40, generation_tokens=3, finished={**NO_FINISH, "length": 1}, steps=3)
    assert sim.rejected == 1  # the empty prompt at 0.5 s
    sim = Simulation(EngineConfig(), [RequestSpec(0.0, 0, 3), RequestSpec(0.0, 0, 3)])
    assert sim.rejected == 2


def test_hit_rate_is_hits_over_queries_and_none_before_any_query() -> None:
    base = Simulation(EngineConfig(), []).truth()
    assert base.hit_rate is None
    assert replace(base, prefix_queries=8, prefix_hits=2).hit_rate == 0.25


def test_a_stall_resumes_exactly_at_its_end_and_one_without_an_end_at_a_resume() -> None:
    sim = Simulation(EngineConfig(), [], [Fault(1.0, "stall", 2.0), Fault(4.0, "stall"),
                                          Fault(9.0, "resume")])
    sim.advance_to(1.0)
    assert sim.truth().stalled
    sim.advance_to(2.999)
    assert sim.truth().stalled
    sim.advance_to(3.0)
    assert not sim.truth().stalled
    sim.advance_to(8.999)
    assert sim.truth().stalled
    sim.advance_to(9.0)
    assert not sim.truth().stalled


def test_a_wedge_during_a_timed_stall_is_not_ended_by_the_stalls_timer() -> None:
    sim = Simulation(EngineConfig(), [], [Fault(1.0, "stall", 10.0), Fault(2.0, "wedge")])
    sim.advance_to(20.0)
    assert sim.truth().stalled


def test_other_faults_during_a_timed_stall_leave_its_end_alone() -> None:
    sim = Simulation(EngineConfig(), [], [Fault(1.0, "stall", 5.0), Fault(2.0, "leak", 0.1),
                                          Fault(3.0, "lump", 4.0), Fault(4.0, "slow", 1.0)])
    sim.advance_to(5.9)
    assert sim.truth().stalled
    sim.advance_to(6.0)
    assert not sim.truth().stalled


def test_an_idle_or_stalled_server_stops_at_each_fault_and_timer_on_its_way() -> None:
    # a resume scheduled at 5 s ends a stall at 5 s: the request waiting since 3 s runs then
    sim = Simulation(EngineConfig(), [RequestSpec(3.0, 40, 1)],
                     [Fault(1.0, "stall"), Fault(5.0, "resume")])
    sim.advance_to(10.0)
    queue = sim.engine.stats.hist["request_queue_time_seconds"]
    assert (queue.count, queue.sum) == (1, 2.0)
    # stalled: work resumes at 3 s and is done by 10 s
    sim = Simulation(EngineConfig(), [RequestSpec(0.0, 40, 100)], [Fault(0.0, "stall", 3.0)])
    sim.advance_to(10.0)
    assert sim.truth().finished["length"] == 1


def test_an_injected_timed_stall_ends_that_long_after_now() -> None:
    sim = Simulation(EngineConfig(), [])
    sim.advance_to(3.0)
    sim.inject("stall", 2.0)
    sim.advance_to(4.999)
    assert sim.truth().stalled
    sim.advance_to(5.0)
    assert not sim.truth().stalled
    sim.inject("restart")
    assert sim.clock == 5.0  # the new engine starts at the server's time, not at 0


def test_a_stalled_server_jumps_from_event_to_event_and_aborts_on_time() -> None:
    sim = Simulation(EngineConfig(), [RequestSpec(1.0, 100, 50, abort_after=0.5)],
                     [Fault(0.0, "stall")])
    assert sim.truth().stalled  # a fault at 0 is in force from the start
    sim.advance_to(10.0)
    truth = sim.truth()
    assert (truth.finished["abort"], truth.waiting, truth.steps) == (1, 0, 0)
    # the client gave up 0.5 s after it came, not when the clock reached 10 s
    assert sim.engine.stats.hist["e2e_request_latency_seconds"].sum == 0.5


def test_an_idle_server_jumps_to_the_next_arrival_and_runs_it_then() -> None:
    sim = Simulation(EngineConfig(), [RequestSpec(2.0, 40, 1)])
    sim.advance_to(5.0)
    queue = sim.engine.stats.hist["request_queue_time_seconds"]
    assert (queue.count, queue.sum) == (1, 0.0)  # scheduled the moment it came
    assert sim.engine.stats.hist["e2e_request_latency_seconds"].sum == pytest.approx(0.0066)


def test_max_steps_stops_exactly_there_and_zero_runs_nothing() -> None:
    sim = Simulation(EngineConfig(), [RequestSpec(0.0, 40, 5)])
    assert sim.advance_to(1.0, max_steps=0) is False and sim.truth().steps == 0
    assert sim.advance_to(1.0, max_steps=2) is False and sim.truth().steps == 2
    # three steps finish it, but the limit is checked before the clock can idle to 1 s
    assert sim.advance_to(1.0, max_steps=3) is False and sim.truth().steps == 5
    assert sim.advance_to(1.0, max_steps=1) is True and sim.clock == 1.0


def test_faults_added_or_injected_later_and_lumps_that_add_up() -> None:
    sim = Simulation(EngineConfig(), [])
    sim.add_fault(Fault(5.0, "leak", 0.5))
    sim.advance_to(4.9)
    assert sim.engine.leak_frac == 0.0
    sim.advance_to(5.0)
    assert sim.engine.leak_frac == 0.5
    sim.inject("lump", 30.0)
    sim.inject("lump", 20.0)
    sim.inject("lump")
    assert sim.engine.lump_blocks == 50.0


def test_the_apis_requests_stream_their_tokens_and_end() -> None:
    sim = Simulation(EngineConfig(num_gpu_blocks=100), [])
    heard: list[tuple[int, str | None]] = []
    req = sim.submit(40, 3, (), lambda r, reason: heard.append((r.num_output, reason)))
    assert req is not None and sim.rejected == 0
    sim.advance_to(1.0)
    assert heard == [(1, None), (2, None), (3, None), (3, "length")]
    # the model's limit is what 99 usable blocks of 16 hold: 1584 tokens, the prompt below it
    assert sim.submit(1584, 3, (), lambda r, reason: None) is None and sim.rejected == 1
    assert sim.submit(1584, 3, (), lambda r, reason: None) is None and sim.rejected == 2
    assert sim.submit(1583, 1, (), lambda r, reason: None) is not None
    # a finished request's listener is gone: a restart does not tell it "lost"
    sim.advance_to(2.0)
    sim.restart()
    assert heard[-1] == (3, "length")


def test_the_apis_requests_share_the_prefix_blocks_they_name() -> None:
    sim = Simulation(EngineConfig(num_gpu_blocks=200), [])
    system = tuple(("sys", j) for j in range(32))  # 512 tokens
    sim.submit(600, 2, system, lambda r, reason: None)
    sim.advance_to(1.0)
    sim.submit(700, 2, system, lambda r, reason: None)
    sim.advance_to(2.0)
    assert (sim.truth().prefix_queries, sim.truth().prefix_hits) == (1300, 512)


def test_an_abort_ends_the_request_it_names_never_a_later_one_with_its_id() -> None:
    sim = Simulation(EngineConfig(), [], wall_clock=iter([100.0, 200.0]).__next__)
    heard: list[tuple[str, str | None]] = []
    lost: list[object] = []
    first = sim.submit(40, 100, (), lambda r, reason: (heard.append(("first", reason)),
                                                       lost.append(r)))
    assert first is not None
    sim.restart()
    assert heard == [("first", "lost")] and lost == [first] and sim.truth().created == 200.0
    second = sim.submit(40, 100, (), lambda r, reason: heard.append(("second", reason)))
    assert second is not None and second.req_id == first.req_id  # ids start again
    sim.abort(first)
    assert sim.truth().finished["abort"] == 0 and sim.engine.requests[second.req_id] is second
    sim.abort(second)
    assert heard[-1] == ("second", "abort") and sim.truth().finished["abort"] == 1


def test_a_restart_keeps_the_leak_drops_pending_aborts_and_reseeds_the_engine() -> None:
    assert Simulation(EngineConfig(), []).engine._rng.random() == random.Random(0).random()
    sim = Simulation(EngineConfig(), [RequestSpec(0.0, 100, 1000, abort_after=5.0)],
                     [Fault(0.0, "leak", 0.25), Fault(1.0, "restart")], seed=3)
    assert sim.engine._rng.random() == random.Random(3).random()
    sim.advance_to(10.0)
    truth = sim.truth()
    assert (truth.restarts, truth.leak_frac, sim.engine.leak_frac) == (1, 0.25, 0.25)
    assert truth.finished == NO_FINISH  # the abort due at 5 s died with the old engine
    assert sim.engine._rng.random() == random.Random(3 + 1).random()  # seed + restarts
    lost: list[str | None] = []
    sim.submit(40, 100, (), lambda r, reason: lost.append(reason))
    sim.restart()
    sim.restart()
    assert lost == ["lost"] and sim.truth().restarts == 3
