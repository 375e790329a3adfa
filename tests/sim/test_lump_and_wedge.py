"""The simulator's lump and wedge faults: a lump leaks whole requests at once until its size,
then stops; a wedge takes every free block and stops the engine while requests still arrive."""

from __future__ import annotations

from kvtop.sim.engine import EngineConfig, RequestSpec
from kvtop.sim.faults import Fault, plan
from kvtop.sim.simulation import Simulation
from kvtop.sim.workloads import SyntheticSpec, synthetic
from tests.sim.helpers import check_pool_invariants


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
