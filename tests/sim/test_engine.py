"""The scheduler: batching limits, chunked prefill, prefix counters, preemption, leaks."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtop.sim.engine import Engine, EngineConfig, RequestSpec, StepCost
from tests.mutation_run import examples
from tests.sim.helpers import check_pool_invariants

SYSTEM = tuple(("sys", j) for j in range(32))  # a 512-token shared system prompt


def drain(engine: Engine, limit: int = 100_000) -> None:
    for _ in range(limit):
        if engine.step() is None:
            return
        check_pool_invariants(engine)
    raise AssertionError("engine did not drain")


def test_prefix_counters_are_tokens_counted_at_admission() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=200))
    engine.add_request(RequestSpec(0.0, 600, 4, prefix_keys=SYSTEM))
    drain(engine)
    engine.add_request(RequestSpec(0.0, 700, 4, prefix_keys=SYSTEM))
    drain(engine)
    stats = engine.stats
    assert stats.prefix_queries == 600 + 700
    assert stats.prefix_hits == 512  # the 32 shared blocks of the second request
    assert stats.prompt_tokens == 1300
    assert stats.prompt_tokens_cached == 512
    assert engine.pool.usage() == 0.0


def test_no_prefix_counting_without_caching() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=200, enable_prefix_caching=False))
    for _ in range(2):
        engine.add_request(RequestSpec(0.0, 600, 4, prefix_keys=SYSTEM))
        drain(engine)
    assert engine.stats.prefix_queries == engine.stats.prefix_hits == 0


def test_chunked_prefill_respects_token_budget() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=1000, max_num_batched_tokens=2048))
    req = engine.add_request(RequestSpec(0.0, 5000, 3))
    assert req is not None
    engine.step()
    engine.step()
    assert req.num_computed == 4096 and req.num_output == 0
    engine.step()
    assert req.num_output == 1  # first token after the third chunk
    assert engine.stats.hist["iteration_tokens_total"].sum == 5000


def test_max_num_seqs_limits_running() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=1000, max_num_seqs=3))
    for _ in range(10):
        engine.add_request(RequestSpec(0.0, 20, 50))
    engine.step()
    assert len(engine.running) == 3 and len(engine.waiting) == 7
    drain(engine)
    assert engine.stats.finished["length"] == 10


def test_preemption_takes_the_most_recently_admitted() -> None:
    # 9 usable blocks of 16 tokens; three requests of 40 tokens take 3 blocks each.
    engine = Engine(EngineConfig(num_gpu_blocks=10, max_num_seqs=8))
    reqs = [engine.add_request(RequestSpec(0.0, 40, 200)) for _ in range(3)]
    engine.step()
    assert engine.pool.num_free_blocks == 0
    for _ in range(9):  # KV for tokens 41..48 fits; the 49th needs a fourth block
        engine.step()
    assert engine.stats.preemptions >= 1
    assert reqs[2] in engine.waiting and reqs[2].num_preemptions == 1
    assert reqs[2].num_computed == 0
    assert reqs[0].num_preemptions == 0
    drain(engine)
    assert engine.pool.usage() == 0.0


@pytest.mark.parametrize("reserve", [True, False])
def test_admission_waits_until_the_whole_prompt_fits(reserve: bool) -> None:
    # 19 usable blocks; A holds 13 (200 tokens + output), B's 160-token prompt needs 10.
    # vLLM 0.33 (scheduler_reserve_full_isl) keeps B waiting although its first 32-token
    # chunk would fit; without the gate B is admitted and fills the pool chunk by chunk.
    engine = Engine(EngineConfig(num_gpu_blocks=20, max_num_batched_tokens=32,
                                 reserve_full_sequence=reserve))
    a = engine.add_request(RequestSpec(0.0, 200, 8))
    for _ in range(7):  # A's prefill
        engine.step()
    b = engine.add_request(RequestSpec(0.0, 160, 8))
    engine.step()
    assert a in engine.running
    assert (b in engine.waiting) is reserve
    drain(engine)
    assert engine.pool.usage() == 0.0


def test_finish_by_eos_or_length_and_abort() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=100))
    engine.add_request(RequestSpec(0.0, 30, 100, output_len=5))
    engine.add_request(RequestSpec(0.0, 30, 5))
    victim = engine.add_request(RequestSpec(0.0, 30, 100))
    engine.step()
    assert victim is not None and engine.abort(victim.req_id)
    assert not engine.abort(victim.req_id)
    drain(engine)
    assert engine.stats.finished == {"stop": 1, "length": 1, "abort": 1, "error": 0,
                                     "repetition": 0}
    assert engine.pool.usage() == 0.0


def test_rejects_prompts_longer_than_the_model() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=10))  # 144 tokens of cache
    assert engine.add_request(RequestSpec(0.0, 144, 1)) is None
    req = engine.add_request(RequestSpec(0.0, 100, 500))
    assert req is not None and req.max_tokens == 44


def test_leak_leaves_exactly_the_leaked_blocks_at_idle() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=500))
    engine.leak_frac = 1.0
    for i in range(5):
        engine.add_request(RequestSpec(0.0, 100 + i, 20))
    drain(engine)
    leaked = len(engine.leaked_block_ids())
    assert leaked == 5 * 8  # (100..104 + 20) tokens = 8 blocks each
    assert engine.pool.num_used_blocks == leaked
    assert engine.pool.usage() == pytest.approx(leaked / 499, rel=1e-12)


def test_clock_advances_by_step_cost() -> None:
    cost = StepCost(base_ms=10, prefill_token_ms=1, decode_seq_ms=2, context_kilotoken_ms=0)
    engine = Engine(EngineConfig(num_gpu_blocks=100, cost=cost))
    engine.add_request(RequestSpec(0.0, 50, 3))
    assert engine.step() == pytest.approx(0.060)  # 10 + 50 prefill tokens
    assert engine.step() == pytest.approx(0.012)  # 10 + one decode sequence
    assert engine.clock == pytest.approx(0.072)
    engine.step()
    ttft = engine.stats.hist["time_to_first_token_seconds"]
    assert ttft.count == 1 and ttft.sum == pytest.approx(0.060)


request_st = st.tuples(
    st.integers(1, 300),  # prompt tokens
    st.integers(1, 60),  # max tokens
    st.booleans(),  # starts with the shared prefix
    st.integers(0, 30),  # arrival step
    st.booleans(),  # aborted two steps after arrival
)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(request_st, min_size=1, max_size=25),
    num_blocks=st.integers(24, 120),
    max_num_seqs=st.integers(1, 8),
    budget=st.sampled_from([16, 64, 512]),
    leak_frac=st.sampled_from([0.0, 0.5, 1.0]),
    caching=st.booleans(),
)
def test_invariants_hold_on_random_workloads(
    requests: list[tuple[int, int, bool, int, bool]], num_blocks: int, max_num_seqs: int,
    budget: int, leak_frac: float, caching: bool,
) -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=num_blocks, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=budget, enable_prefix_caching=caching))
    engine.leak_frac = leak_frac
    prefix = tuple(("p", j) for j in range(4))
    aborts: dict[int, list[int]] = {}
    # arrivals end by step 30; then enough steps for every token of every request several
    # times over (recompute after preemption), so only a leak can leave work undone
    steps = 400 + 4 * sum(prompt + max_tokens + 2 for prompt, max_tokens, *_ in requests)
    for step in range(steps):
        if step >= 400 and not engine.has_work:
            break
        for prompt, max_tokens, shared, at, abort in requests:
            if at == step:
                keys = prefix if shared and prompt > 64 else ()
                req = engine.add_request(RequestSpec(float(step), prompt, max_tokens,
                                                     prefix_keys=keys))
                if req is not None and abort:
                    aborts.setdefault(step + 2, []).append(req.req_id)
        for req_id in aborts.pop(step, []):
            engine.abort(req_id)
        engine.step()
        check_pool_invariants(engine)
        assert engine.stats.prefix_hits <= engine.stats.prefix_queries
    leaked = len(engine.leaked_block_ids())
    if not engine.has_work:
        # Idle: usage is exactly the leaked blocks (0.0 without a leak).
        assert engine.pool.num_used_blocks == leaked
        assert engine.pool.usage() == pytest.approx(leaked / (num_blocks - 1), rel=1e-12)
        if leak_frac == 0.0:
            assert engine.pool.usage() == 0.0
    else:
        # Only leaked blocks can keep an engine from finishing its work.
        assert leaked > 0
